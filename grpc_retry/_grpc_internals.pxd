# Compiled as extension types (the .py stays their source): their own attributes are then read and set as C struct
# fields, not looked up by name (an asyncio unary call made ~240 such lookups, ~44k instructions: callgrind). Their
# own helpers, and the batch helpers, are C functions: called by name, each cost a method lookup and argument parsing.

cimport cython

cpdef aio_status(attempt)
cpdef aio_initial_metadata(attempt)
cpdef aio_locally_cancelled(attempt)
cpdef tuple _unary_ops(request, metadata, flags)
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

cdef class AioMethod:
    cdef public object _multicallable, _handle, _headers_first, _stream, _channel, _method, _loop, _register
    cdef public AioMethod whole


cdef class AioAttempt:
    cdef object __weakref__  # grpc.aio's channel tracks its calls in a WeakSet
    cdef public object _call, _loop, _status, _initial_metadata, _locally_cancelled, _waiters, _callbacks, _ops
    cdef _Batch _first, _last, _sending, _writing, _closing
    cdef public object _end_waits, _request_stream, sent
    cdef bint _direct
    cdef public object on_headers, on_end, on_sent, on_written
    cdef _end(self, finished)
    cdef _abandon(self)
    cdef _wake(self)
    cdef _set_headers(self, metadata)
    cdef _set_status(self, status)


# A hedged sync unary attempt's path (and the future's): its state read and set as struct fields, its helpers C
# calls (a blocking hedged call made ~20 Python-level calls among them: callgrind).
cdef _tell(callback, attempt)
cdef _determined(deadline)
cdef _augmented(metadata, compression)
cpdef _decode(value)
cpdef tuple sync_status(call)
cpdef sync_response(call)


cdef class _AttemptState:
    cdef public object code, details, initial_metadata, trailing_metadata, debug_error_string, response


@cython.locals(state=_AttemptState)
cdef _read_status(state, status)


cdef class _SyncAttempt:
    cdef public _AttemptState _state


cdef class _UnaryAttempt(_SyncAttempt):
    cdef public object _call, _ops, _lock, on_headers, on_end
    cdef _init_unary(self, receiving, on_end)
    @cython.locals(state=_AttemptState)
    cpdef _end(self, success)
    @cython.locals(state=_AttemptState)
    cpdef cancel(self)


cdef class SyncUnaryAttempt(_UnaryAttempt):
    cpdef _on_event(self, event)


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
    @cython.locals(state=_AttemptState)
    cpdef _on_event(self, event)
