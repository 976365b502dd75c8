# Hedging (A6 "Hedging Policy"): several attempts of one call live at once.
#
# Theory of operation. The original attempt starts at once; another is due every hedgingDelay (all of them
# at once when the delay is 0), up to maxAttempts, each to an address the call has not used. Attempt i
# carries grpc-previous-rpc-attempts = i. The driver reports what happens — an attempt began, wrote messages,
# committed (first response headers or message), ended with a status, a timer fired — and after each event
# reads what to do:
#   finished   the call is over: deliver the status of attempt `final` (-1: the deadline passed first), and
#              cancel every other live attempt;
#   winner     >= 0: the call committed to that attempt: cancel every other live attempt;
#   hedge_due(now)    start another attempt now (call begin_attempt);
#   next_hedge_at     otherwise arm a timer for then (inf: no hedge planned).
# A non-fatal status brings the next hedge forward to now (or to now + pushback), later ones follow at
# hedgingDelay; a fatal status ends the call; a "stop" pushback or throttling stops further hedges; when
# every attempt has failed and no hedge can follow, the last status to arrive is delivered.

cdef class HedgingCall(CallCore):
    cdef readonly int live              # attempts begun and not yet ended
    cdef readonly int winner            # the attempt the call committed to (-1: none yet)
    cdef readonly int final             # with finished: the attempt whose status is delivered (-1: none)
    cdef readonly double next_hedge_at  # when the next hedge is due (inf: none planned)
    cdef readonly bint stopped          # no further hedges (pushback "stop", throttled)
    cdef list _sent                     # per attempt: messages written to it
    cdef list _ended                    # per attempt: its status arrived
    cdef int _last                      # the attempt whose status arrived last

    def __init__(self, CallPolicy policy, RetryThrottle throttle, BufferPool pool, long per_rpc_limit,
                 double deadline, bint enabled=True):
        CallCore.__init__(self, policy, throttle, pool, per_rpc_limit, deadline, enabled)
        self.winner = -1
        self.final = -1
        self._last = -1
        self.next_hedge_at = -INFINITY  # the original attempt is due at once
        self._sent = []
        self._ended = []

    # -- attempts ---------------------------------------------------------------------------------------

    cpdef bint hedge_due(self, double now):
        """Whether the driver should begin another attempt now. The first always goes (deadline allowing);
        later ones only while the throttle allows retries (A6: they are cancelled, not delayed, otherwise)."""
        if self.finished or self.committed and self.attempts > 0:
            return False
        if now >= self.deadline:
            if self.live == 0:
                self._finish(-1)
            return False
        if self.stopped or self.attempts >= self.max_attempts or now < self.next_hedge_at:
            return False
        if self.attempts > 0 and self.throttle is not None and not self.throttle.allows_retry():
            self.stopped = True
            self.next_hedge_at = INFINITY
            if self.live == 0:
                self._finish(self._last)
            return False
        return True

    cpdef int begin_attempt(self, double now):
        """Count the attempt that hedge_due() asked for; returns its index (its grpc-previous-rpc-attempts)."""
        cdef int index = self.attempts
        self.attempts += 1
        if index > 0:
            self.policy.stats.record_retry(index)
        self.live += 1
        self._sent.append(0)
        self._ended.append(False)
        if self.committed:
            # Committed by overflow while no attempt was live: this one carries the call, alone.
            self.winner = index
            self.next_hedge_at = INFINITY
        elif self.attempts < self.max_attempts:
            self.next_hedge_at = now + self.policy.hedging_delay
        else:
            self.next_hedge_at = INFINITY
        return index

    cpdef bint on_transparent(self, int index, int kind, double now):
        """Attempt `index` failed before the server's application saw it: True to start it again at once
        (same index, same metadata, not counted); False to treat the failure as its status."""
        if self.winner >= 0 and index != self.winner or not self._transparent_allowed(kind, now):
            return False
        self._sent[index] = 0
        return True

    cpdef void on_sent(self, int index, long count):
        """Attempt `index` has now written `count` messages (to choose the winner when the buffer overflows)."""
        self._sent[index] = count

    cpdef void on_commit(self, int index):
        """Attempt `index` got response headers or a message: the call is that attempt's from now on."""
        if self.finished or self.winner >= 0 or self._ended[index]:
            return
        self._commit_to(index)

    cpdef void on_status(self, int index, int code, object trailing_metadata, double now):
        """Attempt `index` ended with `code`."""
        cdef bint non_fatal, stop
        cdef long pushback
        if self._ended[index]:
            return
        self._ended[index] = True
        self._last = index
        self.live -= 1
        if index > 0 and code != STATUS_OK and (self.winner < 0 or index == self.winner):
            self.policy.stats.record_failure()  # not a loser the driver cancelled
        if self.finished:
            return
        if self.winner >= 0:
            if index == self.winner:
                if code == STATUS_OK and self.throttle is not None:
                    self.throttle.record_success()
                self._finish(index)
            return
        if code == STATUS_OK:
            if self.throttle is not None:
                self.throttle.record_success()
            self._finish(index)
            return
        non_fatal = code < 32 and (self.policy.retryable_mask >> code) & 1
        pushback = parse_pushback(trailing_metadata)
        stop = pushback == PUSHBACK_STOP
        if self.throttle is not None and (non_fatal or stop):
            self.throttle.record_failure()
        if not non_fatal:
            self._finish(index)
            return
        if stop:
            self.stopped = True
            self.next_hedge_at = INFINITY
        elif self.attempts < self.max_attempts and not self.stopped:
            # The next hedge comes forward: now, or when the server asks.
            self.next_hedge_at = now + pushback / 1000.0 if pushback >= 0 else now
        if self.live == 0 and (self.stopped or self.attempts >= self.max_attempts or now >= self.deadline):
            self._finish(index)

    # -- commit and the buffer ----------------------------------------------------------------------------

    cdef void _overflow(self):
        # A6: commit to the attempt that has sent the most messages (the earliest among equals).
        cdef int i, best = -1
        for i in range(len(self._sent)):
            if not self._ended[i] and (best < 0 or self._sent[i] > self._sent[best]):
                best = i
        if best >= 0:
            self._commit_to(best)
        elif self.attempts > 0:
            # Every attempt has ended and the buffer cannot hold a replay: no hedge can follow (A6: evicted
            # calls cancel their pending hedges), so the call ends with the last status.
            self._finish(self._last)
        else:
            self.commit()  # the original has not started yet: it will carry the call alone

    cdef void _commit_to(self, int index):
        self.winner = index
        self.next_hedge_at = INFINITY
        self.commit()

    cdef void _finish(self, int index):
        self.final = index
        self.next_hedge_at = INFINITY
        self.finish()

    def __repr__(self):
        return (f"HedgingCall(attempts={self.attempts}/{self.max_attempts}, live={self.live}, "
                f"winner={self.winner}, finished={self.finished}, final={self.final}, "
                f"next_hedge_at={self.next_hedge_at}, buffered={self.buffered})")
