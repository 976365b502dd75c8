# Compiled as an extension type (the .py stays its source): see setup.py.

from grpc_retry.sync._attempts cimport _Attempts


cdef class BlockingStreamCall(_Attempts):
    cdef public object _lock, _changed, _requests, _serializer, _pulling, _exhausted, _current, _outbox, _attempt
    cdef public object _next, _timer_at, _generation, _wake, _ending, _delivered, _end_code, _last, _local_details
    cdef public object _refusal, _own
    cpdef run(self, with_call)
