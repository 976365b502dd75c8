from grpc_retry._core cimport HeadersWatch
from grpc_retry._telemetry cimport Telemetry

# Compiled as an extension type (the .py stays its source): see setup.py. The channels' methods are
# Python classes over it.

cdef class Method:
    cdef public object _state, _method, _serializer, deserializer, _inner, _policy, _attempt_kind, direct
    cdef public object headers_first, subchannels, attempt_streams, unary_response, watched, _shape
    cdef public set calls
    cdef public object _timeout, _wait_for_ready, _throttle, _pool, _picker, _per_rpc_buffer, _enable_retries
    cdef public object _budget, _admission, _hashing, _faults
    cdef public Telemetry _telemetry
    cdef public object _addresses, _started
    cdef public bint _early_said
    cdef public HeadersWatch _watch
    cpdef inner(self, index)
    cpdef bint first_whole(self)
    cpdef attempt_started(self, index)
    cpdef _serialize(self, request)
    cpdef closed(self)
    cpdef observe(self, machine)
    cpdef deserialize(self, message)
    cpdef _machine(self, timeout, wait_for_ready, unary_request, metadata)
