# Compiled as extension types (the .py stays their source): see grpc_private.pxd. The drivers cimport the
# accessors: each is then a C call.

cimport cython

cpdef aio_status(attempt)
cpdef aio_initial_metadata(attempt)
cpdef aio_locally_cancelled(attempt)
cpdef tell(callback, attempt)
cpdef report_end(call, on_end)
cpdef decode(value)
cpdef tuple sync_status(call)
cpdef sync_response(call)


cdef class AttemptState:
    cdef public object code, details, initial_metadata, trailing_metadata, debug_error_string, response


cdef class SyncAttempt:
    cdef public AttemptState _state


cpdef AttemptState end_record(attempt)


# Either transport's asyncio attempt. The direct one's (a cdef subclass) reads and sets these as C struct fields
# and calls these methods in C; the portable one's (a Python subclass) calls them by name: cpdef, not cdef.
cdef class AioAttemptBase:
    cdef object __weakref__  # grpc.aio's channel tracks its calls in a WeakSet
    cdef public object _call, _loop, _status, _initial_metadata, _locally_cancelled, _request_stream, _waiters
    cdef public object _callbacks, sent, on_headers, on_end, on_sent, on_written
    cpdef _wake(self)
    cpdef _set_headers(self, metadata)
    cpdef _set_status(self, status)
    cpdef _tell_sent(self)
    cpdef _tell_end(self, response)
    cpdef _cancelled(self)


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
