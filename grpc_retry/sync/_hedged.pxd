# Compiled as an extension type (the .py stays its source): see setup.py. Its own steps are C calls
# (cdef), and the callbacks it hands out (an attempt's events, the timer) cpdef.

cimport cython

from grpc_retry._transport.ends cimport AttemptState, sync_response
from grpc_retry._timer cimport TimerHandle, Timers
from grpc_retry.sync._attempts cimport _Attempts


cdef class HedgedBlockingCall(_Attempts):
    cdef public object _lock, _out, _timer_at, _handed, _ending, _ended, _changed
    cdef public object _attempt
    cdef public TimerHandle _timer
    cdef public object _local_details
    cdef public bint _headers_first
    cpdef run(self, with_call)
    cdef _run(self)
    cdef bint _wait_for_end(self) except -1
    cdef _handed_over(self)
    cdef bint _first(self, n, address, previous) except -1
    cdef _refused(self, error)
    cdef _apply(self, actions, attempt, bint alone)
    cdef _set_timer(self, at, bint alone)
    cdef _done(self)
    cpdef _on_headers(self, attempt)
    @cython.locals(state=AttemptState)
    cpdef _on_end(self, attempt)
    cpdef _due(self)
    cdef _after(self, decided, attempt)
    cdef _decided(self, actions, live)
    cdef _broken(self)
    cdef _fail(self, details)
    cdef bint _end_internal(self, details) except -1
    cdef _hand_over(self, actions, live)
    cdef _interrupted(self)


cdef bint _inline(actions, bint starting) except -1
cdef _timer_at(actions, at)

cdef Timers TIMERS  # (the process's: its schedule() a C call)
