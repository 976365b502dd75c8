# Compiled as an extension type (the .py stays its source): see setup.py. Its per-action methods are
# cpdef: a driver's own calls of them are C calls through its vtable, not lookups by name. A subclass's def of one
# overrides it there (Cython makes it cpdef), and a Python class's override still runs.

from grpc_retry._core cimport CallMachine
from grpc_retry._method cimport Method
from grpc_retry._telemetry cimport CallTelemetry

# The helpers a call's path uses: C calls from the drivers (cimported), Python functions for the rest.
cpdef attempt_metadata(metadata, previous)
cpdef trailing_with_attempts(trailing, previous)
cpdef grpc_details(details, answered, subchannels=*)


cdef class CallDriver:
    cdef public Method _method
    cdef public CallMachine _machine
    cdef public object _request, _metadata, _credentials, _compression, _grpc_wfr
    cdef public CallTelemetry _obs
    cdef _init_driver(self, method, machine, request, metadata, credentials, wait_for_ready, compression,
                      stream_request)
    cpdef _attempt_metadata(self, n, previous)
    cpdef _act(self, actions)
    cpdef _perform(self, action)
    cpdef _start(self, n, address, previous)
    cpdef _write(self, n, data)
    cpdef _half_close(self, n)
    cpdef _cancel_attempt(self, n)
    cpdef _commit(self, n)
    cpdef _arm(self, at)
    cpdef _deliver(self, n)
    cpdef _flush(self)
    cpdef _end(self, code)
