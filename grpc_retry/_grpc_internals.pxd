# Compiled as extension types (the .py stays their source): their own attributes are then read and set as C struct
# fields, not looked up by name. Their own helpers, and the batch helpers, are C functions (cpdef where another
# module cimports them): called by name, each would cost a method lookup and argument parsing.

cimport cython

cpdef aio_status(attempt)
cpdef aio_initial_metadata(attempt)
cpdef aio_locally_cancelled(attempt)
cpdef tuple unary_ops(request, metadata, flags)

# A hedged sync unary attempt's path (and the future's): its state read and set as struct fields, its helpers C
# calls.
cpdef tell(callback, attempt)
cpdef determined(deadline)
cpdef augmented_metadata(metadata, compression)
cpdef decode(value)
cpdef tuple sync_status(call)
cpdef sync_response(call)


cdef class AttemptState:
    cdef public object code, details, initial_metadata, trailing_metadata, debug_error_string, response


@cython.locals(state=AttemptState)
cpdef read_status(state, status)


cdef class SyncAttempt:
    cdef public AttemptState _state
