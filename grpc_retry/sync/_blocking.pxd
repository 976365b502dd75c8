# Compiled as an extension type (the .py stays its source): see setup.py.

from grpc_retry.sync._attempts cimport _Attempts


cdef class BlockingCall(_Attempts):
    cdef public object _next, _timer_at, _generation, _ended, _last, _local_details, _with_call
    cpdef run(self, with_call)
    cdef _timeout(self)
    cdef bint _timed_out(self, details, initial) except -1
