# Compiled as an extension type (the .py stays its source): see setup.py. The sync driver cimports it: its
# wait() and notify_all() are C calls.

cdef class Waiters:
    cdef object _lock
    cdef list _waiting
    cpdef bint wait(self, timeout=*) except -1
    cpdef notify_all(self)
