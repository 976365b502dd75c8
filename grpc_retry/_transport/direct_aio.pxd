# Compiled as extension types (the .py stays their source): see setup.py.

from grpc_retry._transport.grpc_private cimport unary_ops
from grpc_retry._transport.batches cimport _Batch
from grpc_retry._transport.ends cimport AioAttemptBase


cdef class AioMethod:
    cdef public object _multicallable, _handle, _headers_first, _stream, _channel, _method, _loop, _register
    cdef public AioMethod whole


cdef class AioAttempt(AioAttemptBase):
    cdef public object _ops
    cdef _Batch _first, _last, _sending, _writing, _closing
    cdef public object _end_waits
    cdef bint _direct
    cdef _end(self, finished)
    cdef _abandon(self)
    cpdef _cancelled(self)
