# The channel-wide replay budget (A6 "Memory Management"): bytes that all calls of a channel may hold for
# replay together. Calls reserve before buffering and release when they commit or end.

cdef class BufferPool:
    def __init__(self, long capacity):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self.used = 0

    cdef bint reserve(self, long nbytes):
        if self.used + nbytes > self.capacity:
            return False
        self.used += nbytes
        return True

    cdef void release(self, long nbytes):
        self.used -= nbytes
