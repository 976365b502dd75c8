# Compiled as an extension type (the .py stays its source): see setup.py. The multicallables are Python
# classes over it (with grpc's abstract classes); the steps to a call's start are C calls, and the calls' own types
# (cimported) are constructed and run without lookups by name.

cimport cython

from grpc_retry._method cimport Method
from grpc_retry.sync._call cimport _Future


cdef class _MultiCallable(Method):
    cdef public object workers
    cpdef _request_bytes(self, request)
    cpdef _call(self, request, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)
    @cython.locals(call=_Future)
    cpdef _blocking(self, request, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                    with_call)
