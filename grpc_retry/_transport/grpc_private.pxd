# Compiled (the .py stays its source): see setup.py. The direct transport's helpers are C functions.

cimport cython

from grpc_retry._transport.ends cimport AttemptState

cpdef tuple unary_ops(request, metadata, flags)

# A hedged sync unary attempt's path (and the future's): its helpers C calls.
cpdef determined(deadline)
cpdef augmented_metadata(metadata, compression)


@cython.locals(state=AttemptState)
cpdef read_status(state, status)
