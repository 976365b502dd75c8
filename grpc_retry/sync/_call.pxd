# Compiled as an extension type (the .py stays its source): see setup.py. Call and
# StreamingCall are Python classes over _Future (with grpcio's abstract classes).

from grpc_retry.sync._nonblocking cimport _NonBlocking


cdef class _Future(_NonBlocking):
    cpdef _reading(self, peeked=*)
    cpdef _until_told(self, n)
