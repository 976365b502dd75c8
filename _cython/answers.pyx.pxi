# Whether and when an attempt answered, for the call machine (machine.pyx.pxi): the silence after empty
# headers, headers sent ahead of the response, and perAttemptRecvTimeout, the timer of an attempt that has not
# answered.

# Empty response headers are real headers, or a Trailers-Only response whose status is a moment behind them
# (grpcio can report the first before the second): silence this long after them means real ones.
cdef double _HEADERS_GRACE = 0.05
# Headers that commit a call this long before its status were sent ahead of its response (`headers_ahead`).
cdef double _EARLY_HEADERS = 0.02
HEADERS_GRACE = _HEADERS_GRACE
EARLY_HEADERS = _EARLY_HEADERS


cdef void _ahead(CallMachine self):
    """Its server sent response headers ahead of the response: its method's first attempts show their headers
    first from now on."""
    self.headers_ahead = True
    if self.watch is not None:
        self.watch.early = True


cdef void _silence_lasted(CallMachine self, double now, list out) except *:
    # The attempt whose silence after empty headers lasted first answered then: the call commits to it.
    cdef int i, first = -1
    cdef _Attempt a
    for i in range(len(self._attempts)):
        a = <_Attempt>self._attempts[i]
        if a.live and a.quiet_until <= now and (
                first < 0 or a.quiet_until < (<_Attempt>self._attempts[first]).quiet_until):
            first = i
    if first >= 0:
        a = <_Attempt>self._attempts[first]
        _ahead(self)
        self._answer(first, a, a.quiet_until - _HEADERS_GRACE, out)


cdef void _recv_timers(CallMachine self, double now, list out) except *:
    """The attempts whose per-attempt timer is due: each is cancelled, a retryable failure."""
    cdef int i
    cdef _Attempt a
    for i in range(len(self._attempts)):
        a = <_Attempt>self._attempts[i]
        if not a.live or a.recv_by > now:
            continue
        _cancel_attempt(self, i, a, out)
        self.recv_timeouts += 1
        self.policy.stats.record_recv_timeout()
        self._timed_out_last = True
        if self.live == 0:
            self._idle_since = now
        if self.notes is not None:
            self.notes.append((NOTE_RECV_TIMEOUT, i))
        if self.picker.counting:  # a backend that does not answer is failing
            self.picker.record(a.address, a.born, False)
        if a.previous > 0:
            self.policy.stats.record_failure()
        if self.winner == i:  # committed to it (an overflow): it carried the call
            _end_last(self, out, R_COMMITTED, now)
            return
        if self.throttle is not None and not self.throttle.record_failure():
            self._stopped = True
            self._stop_reason = R_THROTTLED
            if self.notes is not None:
                self.notes.append((NOTE_STOP, R_THROTTLED, self.throttle.tokens))
        elif self.counted < self.max_attempts and not self._stopped and not _budget_refuses(self, now):
            self.next_at = now + self._backoff(PUSHBACK_NONE)
            if self.notes is not None:
                self.notes.append((NOTE_BACKOFF, i, self.next_at - now, self.counted + 1, self.max_attempts))
