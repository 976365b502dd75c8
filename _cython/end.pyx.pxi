# How a call ends, for the call machine (machine.pyx.pxi): with its last attempt's result, or a status no
# server sent.

cdef void _end(CallMachine self, list out, int kind, int value, int reason, double now) except *:
    """The call is over: cancel what is live, disarm, free the buffer, then DELIVER or END."""
    cdef int i
    cdef _Attempt a
    if self.live == 0 and self.state != IDLE:
        self.idle_time += now - self._idle_since
    for i in range(len(self._attempts)):
        a = <_Attempt>self._attempts[i]
        if a.live:
            _cancel_attempt(self, i, a, out)
    if self.waiting:
        self.waiting = False
        out.append((A_UNWAIT,))
    self._set_timer(INFINITY, out)
    _release(self)
    if self.budget is not None:
        while self._budget_held > 0:  # retries decided and never sent (the call ended in their backoff)
            self._budget_held -= 1
            self.budget.retry_ended()
        self.budget.call_ended()
    self._messages = []
    del self._redos[:]
    self.committed = True
    self.next_at = INFINITY
    self.state = DONE
    self.reason = reason
    self.policy.stats.record_call(len(self._attempts), self.transparent_retries, self._overflowed, reason)
    if self.notes is not None:
        self.notes.append((NOTE_END, reason, value if kind == A_END else -1, value if kind == A_DELIVER else -1))
    out.append((kind, value))


cdef void _end_last(CallMachine self, list out, int reason, double now) except *:
    """The call ends with its last attempt's result: its status, or, when its per-attempt timer cancelled it,
    the status grpcio gives then (CANCELLED; the driver words it from `recv_timeout_ended`)."""
    if not self._timed_out_last:
        _end(self, out, A_DELIVER, self._last, reason, now)
        return
    self.recv_timeout_ended = True
    _end(self, out, A_END, STATUS_CANCELLED,
         R_RECV_TIMEOUT if reason == R_EXHAUSTED or reason == R_COMMITTED else reason, now)


cdef bint _has_last(CallMachine self):
    """Whether an attempt has ended (with a status, or cancelled by its per-attempt timer)."""
    return self._last >= 0 or self._timed_out_last


cdef int _exhausted_reason(CallMachine self, double now):
    if self._stopped and self._stop_reason != R_NONE:
        return self._stop_reason
    if self.counted >= self.max_attempts:
        return R_EXHAUSTED if self.max_attempts > 1 else R_FATAL
    if now >= self.deadline:
        return R_DEADLINE
    return R_COMMITTED if self.committed else R_EXHAUSTED
