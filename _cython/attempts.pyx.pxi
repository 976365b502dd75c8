# The attempts of a call, as the call machine (machine.pyx.pxi) keeps them: each started on the address the
# picker gives, and cancelled.

cdef class _Attempt:
    """One attempt of a call, as the machine keeps it."""


cdef _Attempt _live(CallMachine self, int n, str event):
    if self.state == DONE or n < 0 or n >= len(self._attempts) or not (<_Attempt>self._attempts[n]).live:
        self._impossible(f"{event}({n})")
    return <_Attempt>self._attempts[n]


cdef int _pick(CallMachine self) except? -2:
    # A slot given to another address since this call used it is no longer "used" (picker.pyx.pxi).
    if self._births != self.picker.births:
        if self._used:
            self._used = self.picker.forget(self._used, self._births)
        self._births = self.picker.births
    return self.picker.pick(self._used, self.request_hash)


cdef void _start_attempt(CallMachine self, int address, int previous, double now, list out, int why) except *:
    cdef _Attempt a = _Attempt()
    cdef int n = len(self._attempts)
    a.previous = previous
    a.generation = self.picker.generation
    a.address = address
    a.born = self.picker._born[address]
    a.started = now
    a.recv_by = now + self.recv_timeout
    a.quiet_until = INFINITY
    a.live = True
    if why != ORIGINAL and why != TRANSPARENT and self._budget_held > 0:
        a.budgeted = True  # (the retry or hedge the budget allowed: in flight until it ends)
    self._attempts.append(a)
    self._used = self._used | (1 << address)
    if self.picker.loads:
        self.picker.load_started(address)
    if self.live == 0:
        self.idle_time += now - self._idle_since
    self.live += 1
    out.append((A_START, n, address, previous))
    if self.notes is not None:
        self.notes.append((NOTE_START, n, address, previous, why, now - self._last_start))
    self._last_start = now
    if self.committed and self.winner < 0:
        self.winner = n
        out.append((A_COMMIT, n))
        if self.notes is not None:
            self.notes.append((NOTE_COMMIT, n, COMMIT_OVERFLOW if self._overflowed else COMMIT_ANSWER))
    if self.unary_request:
        a.sent = 1
        a.closing = True
    else:
        _write_to(self, n, a, out)


cdef void _cancel_attempt(CallMachine self, int i, _Attempt a, list out) except *:
    a.live = False
    a.writing = False
    self.live -= 1
    if self.picker.loads:
        self.picker.load_ended(a.address, a.born, False)
    if a.budgeted:
        _budget_release(self, a)
    out.append((A_CANCEL, i))
