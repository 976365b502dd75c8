# Compiled as extension types (the .py stays their source): see grpc_retry/_grpc_internals.pxd.

cimport cython

cdef int _PENDING, _COMPLETED, _FINISHED, _ABANDONED


cdef class _Batch:
    cdef object _coroutine, _loop, _error
    cdef public object done
    cdef bint _direct
    cdef int _state
    cdef bint completed(self)
    cdef bint finish(self) except -1
    cdef abandon(self)
    cpdef _tell(self)

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
