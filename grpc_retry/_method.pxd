# Compiled as an extension type (the .py stays its source): see _grpc_internals.pxd. The channels' methods are
# Python classes over it.

cdef class Method:
    cdef public object _state, _method, _serializer, deserializer, _inner, _policy, _attempt_kind, direct
    cdef public object headers_first, reports_end, subchannels, calls, attempt_streams, unary_response
