# Compiled as extension types (the .py stays their source): see setup.py.

cimport cython

from grpc_retry._transport.ends cimport AttemptState, SyncAttempt, tell
from grpc_retry._transport.grpc_private cimport augmented_metadata, determined, read_status, unary_ops


cdef class _UnaryAttempt(SyncAttempt):
    cdef public object _call, _ops, _lock, on_headers, on_end
    cdef _init_unary(self, receiving, on_end)
    @cython.locals(state=AttemptState)
    cpdef _end(self, success)
    @cython.locals(state=AttemptState)
    cpdef cancel(self)


cdef class SyncUnaryAttempt(_UnaryAttempt):
    cpdef _on_event(self, event)


cdef class SyncUnary:
    cdef public object multicallable


cdef class SyncHeadersFirst:
    cdef public object multicallable
    cpdef polled(self, request, timeout, metadata, credentials, wait_for_ready, compression, on_headers, on_end,
                 bint whole)
    cdef _attempt(self, request, deadline, metadata, credentials, wait_for_ready, compression, on_headers, on_end,
                  bint polled, bint whole)


cdef class SyncHeadersFirstAttempt(_UnaryAttempt):
    cdef public object _end_waits
    cdef public bint polled
    cpdef poll(self)
    @cython.locals(state=AttemptState)
    cpdef _on_event(self, event)
