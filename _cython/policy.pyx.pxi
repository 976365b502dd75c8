# What the core needs of one method's config, resolved once per channel and method so that a call costs a
# dict lookup, not a parse. Status codes become a bit mask (codes are 0..16).

cdef inline unsigned int code_mask(codes) except? 0:
    cdef unsigned int mask = 0
    cdef int code
    for code in codes:
        if code < 0 or code > 31:
            raise ValueError(f"status code out of range: {code}")
        mask |= 1u << code
    return mask


# A6 "Retry and Hedging Statistics", per method: retry attempts made (hedges after the first count as
# retries), those that failed, and a histogram of which retry each attempt was.
cdef tuple STATS_BUCKETS = (1, 2, 3, 4, 5, 10, 100, 1000)


cdef class RetryStats:
    cdef void record_call(self, long attempts, long transparent, bint overflowed, int reason):
        self.calls += 1
        self.attempts += attempts
        self.transparent_retries += transparent
        if overflowed:
            self.committed_by_overflow += 1
        if reason == R_THROTTLED:
            self.stopped_by_throttling += 1
        elif reason == R_PUSHBACK:
            self.stopped_by_pushback += 1
        elif reason == R_EXHAUSTED or reason == R_RECV_TIMEOUT:
            self.stopped_by_attempt_limit += 1

    cdef void record_retry(self, int n):
        """The n-th retry (n >= 1) of a call began: it counts in the bucket of the largest threshold <= n."""
        cdef int i = 7
        while i > 0 and n < <int>STATS_BUCKETS[i]:
            i -= 1
        self.retries += 1
        self._buckets[i] += 1

    cdef void record_failure(self):
        self.retries_failed += 1

    cdef void record_recv_timeout(self):
        self.attempts_timed_out += 1

    cdef void record_server_delay(self):
        self.server_delays += 1

    cdef void record_budget_refusal(self):
        self.refused_by_budget += 1

    def histogram(self):
        return {f">={STATS_BUCKETS[i]}": self._buckets[i] for i in range(8)}

    def as_dict(self):
        return {"retry_attempts": self.retries, "retry_attempts_failed": self.retries_failed,
                "histogram": self.histogram()}


cdef class CallPolicy:
    """Retry or hedging settings of one method. max_attempts 1 means: no retries (a plain call).
    A hedging policy has hedging_delay >= 0, and its nonFatalStatusCodes in retryable_mask. recv_timeout: a retry
    policy's perAttemptRecvTimeout (inf: none); max_server_delay: the longest delay a server's RetryInfo may set."""


    def __init__(self, int max_attempts=1, double initial_backoff=0.0, double max_backoff=0.0,
                 double backoff_multiplier=1.0, retryable_codes=(), double timeout=float("inf"),
                 wait_for_ready=None, double hedging_delay=-1.0, HedgingControl hedge=None,
                 double recv_timeout=float("inf"), double max_server_delay=30.0):
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.backoff_multiplier = backoff_multiplier
        self.retryable_mask = code_mask(retryable_codes)
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        self.hedging_delay = hedging_delay
        self.hedge = hedge
        if not recv_timeout > 0:
            raise ValueError("recv_timeout must be > 0")
        self.recv_timeout = recv_timeout
        self.max_server_delay = max_server_delay
        self.stats = RetryStats()

    @property
    def hedging(self):
        return self.hedging_delay >= 0 and self.max_attempts > 1

    def is_retryable(self, int code):
        return 0 <= code < 32 and (self.retryable_mask >> code) & 1 == 1

    def __repr__(self):
        return (f"CallPolicy(max_attempts={self.max_attempts}, initial_backoff={self.initial_backoff}, "
                f"max_backoff={self.max_backoff}, backoff_multiplier={self.backoff_multiplier}, "
                f"retryable_mask={self.retryable_mask:#x}, timeout={self.timeout}, "
                f"wait_for_ready={self.wait_for_ready}, hedging_delay={self.hedging_delay}, "
                f"recv_timeout={self.recv_timeout}, max_server_delay={self.max_server_delay})")
