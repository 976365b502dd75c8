# Compiled as an extension type (the .py stays its source): see setup.py.

from grpc_retry._driver cimport CallDriver, grpc_details


cdef class _Attempts(CallDriver):
    cdef public object _error, _response, _final
    cdef _init_attempts(self, method, machine, request, metadata, credentials, wait_for_ready, compression,
                        stream_request)
    cdef _timeout(self)
    cpdef _outcome(self, call, previous, response, delivered=*)
    cpdef _local(self, code, details)
