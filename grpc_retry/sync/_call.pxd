# Compiled as an extension type (the .py stays its source): see setup.py. Call and
# StreamingCall are Python classes over _Future (with grpcio's abstract classes).

from grpc_retry.sync._caller cimport _Caller


cdef class _Future(_Caller):
    cpdef _reading(self, peeked=*)
    cpdef _until_told(self, n)
