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


# A call's replay buffer, kept by its machine: every message the application sent until the call commits,
# charged to the call's limit and to the channel's pool, and written to each attempt in order.

cdef void _buffer(CallMachine self, bytes data, double now, list out) except *:
    cdef long size = len(data)
    self._messages.append(data)
    self.total += 1
    if self.committed:
        return
    if self.buffered + size > self.per_rpc_limit or not self.pool.reserve(size):
        _overflow(self, now, out)
        return
    self.buffered += size


cdef void _overflow(CallMachine self, double now, list out) except *:
    # A6: commit to the live attempt that has sent the most (the earliest among equals); with none live, no
    # further attempt may start: the call ends with the last status, or the next start carries it alone.
    cdef int i, best = -1
    cdef _Attempt a
    for i in range(len(self._attempts)):
        a = <_Attempt>self._attempts[i]
        if a.live and (best < 0 or a.sent > (<_Attempt>self._attempts[best]).sent):
            best = i
    self._overflowed = True
    if best >= 0:
        self._commit_to(best, out)
    elif _has_last(self) and not self._redos:
        _end_last(self, out, R_COMMITTED, now)
    else:
        self._commit_pending(out)


cdef void _release(CallMachine self):
    if self.buffered:
        self.pool.release(self.buffered)
        self.buffered = 0


cdef void _write_more(CallMachine self, list out) except *:
    cdef int i
    cdef _Attempt a
    for i in range(len(self._attempts)):
        a = <_Attempt>self._attempts[i]
        if not a.live or a.closing:
            continue
        if not a.writing:
            _write_to(self, i, a, out)
        elif self.half_closed and a.sent + 1 == self.total:
            # Its last message is going out: the half-close follows it at once (the driver sends it after that
            # message), not a round trip later.
            a.closing = True
            out.append((A_HALF_CLOSE, i))


cdef void _write_to(CallMachine self, int n, _Attempt a, list out) except *:
    if a.sent < self.total:
        a.writing = True
        out.append((A_WRITE, n, a.sent, self._messages[a.sent - self.base]))
        if self.half_closed and a.sent + 1 == self.total:  # the last message: see _write_more
            a.closing = True
            out.append((A_HALF_CLOSE, n))
    elif self.half_closed:
        a.closing = True
        out.append((A_HALF_CLOSE, n))
