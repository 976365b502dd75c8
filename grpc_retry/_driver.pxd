# Compiled as an extension type (the .py stays its source): see _grpc_internals.pxd.

cdef class CallDriver:
    cdef public object _machine, _method, _request, _metadata, _credentials, _compression, _grpc_wfr, _obs
