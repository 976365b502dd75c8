# Compiled as an extension type (the .py stays its source): see setup.py.

from grpc_retry.sync._driver cimport _Driver


cdef class _Caller(_Driver):
    cdef _serve(self)
    cdef _run_job(self, n, address, previous)
    cdef _exchanged(self, n, call, response, ok, timer_at)
    cdef _polled(self, n, address, previous, inner)
    cdef _streamed(self, n, address, previous, inner)
