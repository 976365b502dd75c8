# Compiled as extension types (the .py stays their source): see setup.py.

from grpc_retry._transport.grpc_private cimport unary_ops
from grpc_retry._transport.batches cimport _Batch


cdef class AioMethod:
    cdef public object _multicallable, _handle, _headers_first, _stream, _channel, _method, _loop, _register
    cdef public AioMethod whole


cdef class AioAttempt:
    cdef object __weakref__  # grpc.aio's channel tracks its calls in a WeakSet
    cdef public object _call, _loop, _status, _initial_metadata, _locally_cancelled, _waiters, _callbacks, _ops
    cdef _Batch _first, _last, _sending, _writing, _closing
    cdef public object _end_waits, _request_stream, sent
    cdef bint _direct
    cdef public object on_headers, on_end, on_sent, on_written
    cdef _end(self, finished)
    cdef _abandon(self)
    cdef _wake(self)
    cdef _set_headers(self, metadata)
    cdef _set_status(self, status)
