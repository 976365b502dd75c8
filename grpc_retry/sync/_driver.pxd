# Compiled as an extension type (the .py stays its source): see setup.py.

cimport cython

from grpc_retry._transport.ends cimport AttemptState, end_record
from grpc_retry._waiters cimport Waiters
from grpc_retry.sync._attempts cimport _Attempts


cdef class _Driver(_Attempts):
    cdef public Waiters _changed
    cdef public object _attempts, _call_callbacks, _calls, _current, _deferred, _delivered
    cdef public object _done_callbacks, _draining, _ending, _exhausted, _finished, _hedged, _watched, _last
    cdef public object _listener, _live, _local_details, _lock, _outboxes, _peek, _pulling
    cdef public object _queue, _reads, _refusal, _requests, _responses, _serializer, _timer
    cdef public object _timer_token, _tokens, _wait_token
    cdef public object _job, _kept_at, _kept_token, _with_call, _armed_at, _armed_token, _thread
    cdef public int _kind
    cdef public bint _caller, _busy
    cpdef _event(self, decide, n=*)
    cdef _broken(self)
    cdef _take(self, decided)
    cdef _told(self, decided)
    cdef _note(self, actions)
    cpdef _drain(self, actions=*)
    cdef _finish(self)
    cpdef _status(self, n, call, watched_unary=*)
    cpdef _headers_first_ended(self, n, attempt)
    cpdef _due(self)
    cdef _fire(self, token)
    @cython.locals(state=AttemptState)
    cdef _unary_ended(self, n, attempt)
    cdef _init_call(self, method, machine, request, request_iterator, serializer, metadata, credentials,
                    wait_for_ready, compression, int caller)
    cdef _begin(self)
