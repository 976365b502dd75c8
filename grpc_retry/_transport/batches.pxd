# Compiled as extension types (the .py stays their source): see setup.py.

from grpc_retry._transport.ends cimport _Dispatch

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

cdef _Dispatch _DISPATCH
