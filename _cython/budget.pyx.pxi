# Retry budgets (grpc_retry.retry_budget): the extra load that retries and hedges may add, in the two forms meshes
# use. One instance per target and settings, shared by calls, as the throttle is; every method runs with the GIL
# held and calls no Python code, so it is atomic for threaded drivers too. O(1) per call and per retry.
#
# - Rate (the Gateway API's GEP-3388, Finagle's RetryBudget, tower's TpsBudget): over any `interval` the retries
#   may number at most `percent` % of the calls started in it; and `min_count` per `min_interval` are allowed
#   whatever the percentage says. Each window is ten slots that roll as time goes, forgetting the oldest.
#   `credit`: retries allowed beyond the share, once (a budget with room from its start, as a token bucket starts
#   full; kept out of the window, so that nothing it paid for outlives it there): hedging's max_extra_load is this
#   form, and may hedge while its delay is still learning.
# - Concurrency (Envoy's cluster retry_budget): retries in flight at most max(`percent` % of the calls in flight,
#   `min_count`). A retry is in flight from the moment it is decided, its backoff included, until its attempt ends
#   or its call does (Envoy counts it only once sent, and overshoots by the retries waiting). `max_in_flight`
#   (>= 0) caps them besides (an xDS cluster's explicit max_retries).

from libc.math cimport floor

cdef int _SLOTS = 10  # (the size of _Window.counts, grpc_retry/_core.pxd)


cdef class _Window:
    """Counts per slot of `width` seconds, over the last _SLOTS slots (`slot`: the current one's number)."""

    def __init__(self, double span):
        self.width = span / _SLOTS
        self.slot = -1
        self.total = 0
        for i in range(_SLOTS):
            self.counts[i] = 0

    cdef void roll(self, double now):
        cdef long long slot = <long long>floor(now / self.width)
        cdef long long k
        if slot <= self.slot:
            return
        if slot - self.slot >= _SLOTS:
            for k in range(_SLOTS):
                self.counts[k] = 0
            self.total = 0
        else:
            for k in range(self.slot + 1, slot + 1):
                self.total -= self.counts[k % _SLOTS]
                self.counts[k % _SLOTS] = 0
        self.slot = slot

    cdef void add(self):
        self.counts[self.slot % _SLOTS] += 1
        self.total += 1


cdef class RetryBudget:
    def __init__(self, bint concurrent, double percent, long min_count, double interval=10.0,
                 double min_interval=1.0, long max_in_flight=-1, long credit=0):
        # (percent over 100: hedging's max_extra_load may exceed one hedge a call; the option's parser keeps to 100)
        if not percent >= 0.0 or min_count < 0 or interval <= 0 or min_interval <= 0 or credit < 0:
            raise ValueError("percent, min_count and credit must be at least 0, intervals positive")
        self.concurrent = concurrent
        self.percent = percent
        self.min_count = min_count
        self.interval = interval
        self.min_interval = min_interval
        self.max_in_flight = max_in_flight
        self._calls = _Window(interval)
        self.credit = credit
        self._retries = _Window(interval)
        self._floor = _Window(min_interval)
        self.calls_in_flight = 0
        self.retries_in_flight = 0
        self.refused = 0

    cpdef void call_started(self, double now):
        if self.concurrent:
            self.calls_in_flight += 1
        else:
            self._calls.roll(now)
            self._calls.add()

    cpdef void call_ended(self):
        if self.concurrent and self.calls_in_flight > 0:
            self.calls_in_flight -= 1

    cpdef bint try_retry(self, double now):
        """A retry or hedge is due: whether the budget allows it (then it is counted)."""
        cdef double limit
        if self.concurrent:
            limit = self.percent * self.calls_in_flight / 100.0
            if (self.retries_in_flight + 1 <= limit or self.retries_in_flight < self.min_count) and \
                    (self.max_in_flight < 0 or self.retries_in_flight < self.max_in_flight):
                self.retries_in_flight += 1
                return True
            self.refused += 1
            return False
        self._calls.roll(now)
        self._retries.roll(now)
        self._floor.roll(now)
        if (self._retries.total + 1) * 100.0 <= self.percent * self._calls.total or \
                self._floor.total < self.min_count:
            self._retries.add()
            self._floor.add()
            return True
        if self.credit > 0:
            self.credit -= 1
            return True
        self.refused += 1
        return False

    cpdef void retry_ended(self):
        """(Concurrency form.) A retry allowed earlier is no longer in flight."""
        if self.concurrent and self.retries_in_flight > 0:
            self.retries_in_flight -= 1

    @property
    def retries_in_window(self):
        return self._retries.total

    @property
    def calls_in_window(self):
        return self._calls.total

    def __repr__(self):
        if self.concurrent:
            return (f"RetryBudget(concurrency: {self.percent:g}% of {self.calls_in_flight} calls in flight, at least "
                    f"{self.min_count}, at most {self.max_in_flight}; {self.retries_in_flight} retries in flight)")
        return (f"RetryBudget(rate: {self.percent:g}% of calls over {self.interval:g}s, at least {self.min_count} "
                f"per {self.min_interval:g}s; {self._retries.total} retries for {self._calls.total} calls)")


# The call machine's use of its target's budget: each retry or hedge asks, and is in flight until it ends.

cdef bint _budget_refuses(CallMachine self, double now) except -1:
    """A retry is decided, or a hedge is due: whether the retry budget refuses it (the call then goes on with
    the attempts it has, and ends with the last one's status). Else it counts it."""
    if self.budget is None:
        return False
    if self.budget.try_retry(now):
        self._budget_held += 1
        return False
    self._stopped = True
    self._stop_reason = R_RETRY_BUDGET
    self.policy.stats.record_budget_refusal()
    if self.notes is not None:
        self.notes.append((NOTE_STOP, R_RETRY_BUDGET, -1.0))
    return True


cdef void _budget_release(CallMachine self, _Attempt a):
    a.budgeted = False
    self._budget_held -= 1
    self.budget.retry_ended()
