# The per-call retry state machine (A6 "Retry Policy Capabilities", "When Retries are Valid").
#
# Theory of operation. A call is a sequence of attempts. Before it is committed, the call keeps what it sent
# (the replay buffer) so that a new attempt can be sent the same messages in order. It commits — and from then
# on runs on one attempt, buffering nothing — on the first of: response headers (a Trailers-Only response does
# not commit), a response message, its buffer overflowing (per call or channel-wide), the application looking at
# attempt state. When an attempt ends, on_status() decides, from the policy, the throttle, pushback, the
# attempt count and the deadline, whether to retry (and after what delay) or to deliver that status.
# The driver owns the I/O: it starts attempts, writes what is in `replay`, sleeps `delay`, and delivers.

cdef enum:
    ACTION_FINISH = 0      # deliver the ended attempt's status: the call is over
    ACTION_RETRY = 1       # begin another attempt after `delay` seconds

# Plain ints for Python callers (an enum object per call would cost an allocation on the hot path).
FINISH = ACTION_FINISH
RETRY = ACTION_RETRY

# Transparent retries (A6 "Transparent Retries"): attempts the server's application never saw.




cdef class CallCore:
    """What every call keeps, retried or hedged: its deadline, the addresses it used, and the replay buffer
    (messages sent so far, charged to the call's and the channel's budget until the call commits)."""

    cdef readonly CallPolicy policy
    cdef RetryThrottle throttle
    cdef BufferPool pool
    cdef long per_rpc_limit
    cdef readonly double deadline
    cdef readonly int max_attempts
    cdef readonly int attempts          # attempts begun that count toward maxAttempts
    cdef readonly bint committed
    cdef readonly bint finished
    cdef readonly long buffered         # bytes charged to this call and to the pool
    cdef readonly list replay           # messages to replay; replay[0] is message number replay_base
    cdef readonly long replay_base
    cdef readonly bint half_closed
    cdef readonly object used           # bit mask of the address indices this call's attempts went to
    cdef bint transparent_enabled
    cdef readonly bint refused_retried  # the one transparent retry of a refused attempt is spent

    def __init__(self, CallPolicy policy, RetryThrottle throttle, BufferPool pool, long per_rpc_limit,
                 double deadline, bint enabled=True):
        self.policy = policy
        self.throttle = throttle
        self.pool = pool
        self.per_rpc_limit = per_rpc_limit
        self.deadline = deadline
        self.max_attempts = policy.max_attempts if enabled else 1
        # A call that may not retry is committed from the start: it buffers nothing.
        self.committed = self.max_attempts <= 1
        self.replay = []
        self.used = 0
        self.transparent_enabled = enabled

    cpdef void use_address(self, int index):
        """The attempt just begun goes to address `index`; later picks avoid it while they can."""
        self.used = self.used | (1 << index)

    cdef bint _transparent_allowed(self, int kind, double now):
        if self.finished or not self.transparent_enabled or now >= self.deadline or self.replay_base != 0:
            return False
        if kind == REFUSED:
            if self.refused_retried:
                return False
            self.refused_retried = True
        return True

    # -- sending and the replay buffer -----------------------------------------------------------------

    cpdef bint add_message(self, bytes message):
        """The application sent `message`: queue it for the attempts. Returns True when it is held for
        replay, False when the call is (or just became, by overflowing its buffers) committed."""
        cdef long n = len(message)
        self.replay.append(message)
        if self.committed:
            return False
        if self.buffered + n > self.per_rpc_limit or not self.pool.reserve(n):
            self._overflow()
            return False
        self.buffered += n
        return True

    cdef void _overflow(self):
        self.commit()

    cpdef void close_send(self):
        self.half_closed = True

    cpdef void trim_sent(self, long sent):
        """The committed attempt has written the first `sent` messages: drop them from memory."""
        if self.committed and sent > self.replay_base:
            del self.replay[:sent - self.replay_base]
            self.replay_base = sent

    # -- ending -----------------------------------------------------------------------------------------

    cpdef void commit(self):
        """Run on one attempt from now on; release the buffer's budget (A6: no more replay)."""
        if self.committed:
            return
        self.committed = True
        self._release()

    cpdef void finish(self):
        """The call is over (delivered or cancelled): free everything it held."""
        self.finished = True
        self.committed = True
        self._release()
        self.replay = []

    cdef inline void _release(self):
        if self.buffered:
            self.pool.release(self.buffered)
            self.buffered = 0


cdef class RetryCall(CallCore):
    cdef object rng
    cdef readonly double delay          # with RETRY: seconds to wait before the next attempt
    cdef readonly int backoff_step      # retries since the last pushback: the exponent of the backoff
    cdef readonly bint transparent      # the next attempt is a transparent retry

    def __init__(self, CallPolicy policy, RetryThrottle throttle, BufferPool pool, long per_rpc_limit,
                 double deadline, rng, bint enabled=True):
        CallCore.__init__(self, policy, throttle, pool, per_rpc_limit, deadline, enabled)
        self.rng = rng

    # -- attempts ---------------------------------------------------------------------------------------

    cpdef int begin_attempt(self, double now):
        """Count a new attempt. Returns the number of attempts before it (grpc-previous-rpc-attempts),
        or -1 when the call is over or its deadline has passed (the driver then ends it DEADLINE_EXCEEDED)."""
        if self.finished or now >= self.deadline:
            return -1
        if self.transparent:
            # A transparent retry stands in for the attempt that failed: same count, same metadata.
            self.transparent = False
            return self.attempts - 1
        self.attempts += 1
        if self.attempts > 1:
            self.policy.stats.record_retry(self.attempts - 1)
        return self.attempts - 1

    cpdef bint on_transparent(self, int kind, double now):
        """The current attempt failed before the server's application saw it (`kind` NOT_SENT or REFUSED).
        True: retry it at once without counting it (maxAttempts, throttle, metadata). False: treat the
        failure as an ordinary status (on_status)."""
        if not self._transparent_allowed(kind, now):
            return False
        self.transparent = True
        self.delay = 0.0
        return True

    cpdef void on_headers(self):
        """Real response headers arrived (not Trailers-Only): the call commits to that attempt."""
        self.commit()

    cpdef int on_status(self, int code, object trailing_metadata, double now):
        """The current attempt ended with `code`. Decide: RETRY (after self.delay) or FINISH."""
        cdef bint retryable, stop, throttled = False
        cdef long pushback
        cdef double cap
        if self.finished:
            return ACTION_FINISH
        if self.max_attempts <= 1:
            self.finish()
            return ACTION_FINISH
        if self.attempts > 1 and code != STATUS_OK:
            self.policy.stats.record_failure()
        if code == STATUS_OK:
            if self.throttle is not None:
                self.throttle.record_success()
            self.finish()
            return ACTION_FINISH
        retryable = code < 32 and (self.policy.retryable_mask >> code) & 1
        pushback = parse_pushback(trailing_metadata)
        stop = pushback == PUSHBACK_STOP
        # Only failures that say "the server is in trouble" count against the throttle.
        if self.throttle is not None and (retryable or stop):
            throttled = not self.throttle.record_failure()
        if (not retryable or stop or throttled or self.committed
                or self.attempts >= self.max_attempts or now >= self.deadline):
            self.finish()
            return ACTION_FINISH
        if pushback >= 0:
            self.delay = pushback / 1000.0
            self.backoff_step = 0
        else:
            cap = self.policy.initial_backoff * self.policy.backoff_multiplier ** self.backoff_step
            if cap > self.policy.max_backoff:
                cap = self.policy.max_backoff
            self.delay = self.rng() * cap
            self.backoff_step += 1
        if now + self.delay > self.deadline:
            # Wake at the deadline; begin_attempt() will then refuse and the call ends DEADLINE_EXCEEDED.
            self.delay = self.deadline - now
        return ACTION_RETRY

    def __repr__(self):
        return (f"RetryCall(attempts={self.attempts}/{self.max_attempts}, committed={self.committed}, "
                f"finished={self.finished}, buffered={self.buffered}, replay={len(self.replay)})")


cpdef int _old_transparent_kind(int code, details):
    """NOT_SENT, REFUSED or -1, from an attempt's status as grpcio reports it. grpcio gives Python nothing but
    the status to tell these apart, so this reads C-core's wording (pinned grpcio range; tests/faults checks it
    against a real HTTP/2 peer)."""
    if code != STATUS_UNAVAILABLE or not details:
        return -1
    if "RST_STREAM with error code 7" in details or "GOAWAY received" in details:
        return REFUSED
    if details.startswith("failed to connect to all addresses"):
        return NOT_SENT
    return -1
