# Compiled as extension types (the .py stays their source): see grpc_private.pxd. The drivers cimport the
# accessors: each is then a C call.

cimport cython

cpdef aio_status(attempt)
cpdef aio_initial_metadata(attempt)
cpdef aio_locally_cancelled(attempt)
cpdef tell(callback, attempt)
cpdef decode(value)
cpdef tuple sync_status(call)
cpdef sync_response(call)


cdef class AttemptState:
    cdef public object code, details, initial_metadata, trailing_metadata, debug_error_string, response


cdef class SyncAttempt:
    cdef public AttemptState _state


cdef class EndWaiter

cdef class _Dispatch:
    cdef public object loop
    cdef public list woken
    @cython.locals(waiter=EndWaiter, i=Py_ssize_t, n=Py_ssize_t)
    cdef wake(self, loop)

cdef _Dispatch _DISPATCH
cdef int _WAITING, _ENDED, _CANCELLED

cdef class EndWaiter:
    cdef object _loop, _callbacks, _cancel_message
    cdef int _state
    cdef public object _asyncio_future_blocking
    cdef _run_soon(self)
    cdef _run(self)
