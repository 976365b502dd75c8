# Compiled as an extension type (the .py stays its source): see _grpc_internals.pxd. Its subclasses (the call
# shapes, with grpc.aio's abstract call classes) are Python classes over it.

from grpc_retry._driver cimport CallDriver


cdef class _Call(CallDriver):
    cdef object __weakref__
    cdef public object _channel
    cdef public object _loop, _hedged, _attempts, _last, _current, _winner, _timer, _listener, _local_details
    cdef public object _refusal, _done, _code, _details, _initial, _trailing, _debug, _response, _waiters, _changed
    cdef public object _callbacks, _watchers, _peek, _reads, _delivered, _style
