# Adaptive hedging, per method with a hedging policy (grpc_retry's own, off unless a channel option asks):
#
# - The delay before each next hedge follows a quantile of recent attempt latencies (time to the first response
#   headers or message): "The Tail at Scale" sends the backup request at the expected p95. The estimate is a
#   fixed log-scale histogram whose samples decay with their age (time constant DECAY seconds): O(1) to record,
#   O(buckets) to read, 1 KiB per method. Its resolution is one bucket: the estimate is within BUCKET_ERROR of
#   the true quantile of what was recorded. The config's hedgingDelay is the floor.
# - Hedges beyond the first attempt are at most max_extra_load of calls: a token bucket, refilled by each call by
#   max_extra_load tokens (up to a cap that makes the window ~WINDOW_CALLS calls), a hedge costing one; it starts
#   full. A due hedge finding no token is not sent; the call goes on with the attempts it has (Finagle's
#   maxExtraLoad).
#
# Attempts cancelled because another won are recorded at their age then: they took at least that long (a
# censored sample); leaving them out would bias the estimate low, hedging earlier and earlier.

from libc.math cimport exp, log

cdef enum:
    N_BUCKETS = 96
cdef double LOW = 50e-6        # the first bucket's lower edge, seconds; below it counts as the first bucket
cdef double HIGH = 100.0       # the last bucket's upper edge; above it counts as the last
cdef double GROWTH = exp(log(HIGH / LOW) / N_BUCKETS)   # each bucket's upper edge over its lower (~1.163)
BUCKET_ERROR = GROWTH - 1.0
DECAY = 2.0                    # seconds: a sample's weight falls by e in this long
MIN_SAMPLES = 20               # fewer (decayed) samples than this: the estimate is not used yet
WINDOW_CALLS = 1000.0


cdef class HedgingControl:
    cdef readonly double quantile        # 0: the delay is the config's
    cdef readonly double floor           # the config's hedgingDelay
    cdef readonly double max_extra_load  # < 0: no budget
    cdef readonly long budget_stopped    # hedges due but not sent for budget
    cdef double _buckets[N_BUCKETS]
    cdef double _total
    cdef double _origin                  # weights are exp((t - origin) / DECAY), rescaled before they overflow
    cdef double _tokens
    cdef double _cap

    def __init__(self, double floor, double quantile=0.0, double max_extra_load=-1.0):
        if not (0.0 <= quantile < 1.0):
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        self.floor = floor if floor > 0 else 0.0
        self.quantile = quantile
        self.max_extra_load = max_extra_load
        # The bucket holds a window's worth of hedges (at least one, so that a small share can ever pay for
        # one), and starts full: while the delay is still learning, the first calls may hedge.
        self._cap = 0.0 if max_extra_load <= 0 else max(1.0, max_extra_load * WINDOW_CALLS)
        self._tokens = self._cap
        self._origin = -INFINITY

    # -- the delay ---------------------------------------------------------------------------------------------

    cpdef void record(self, double latency, double now):
        """An attempt answered `latency` seconds after it started (or was cancelled that old)."""
        cdef int i
        cdef double weight
        if self.quantile <= 0.0:
            return
        if self._origin == -INFINITY:
            self._origin = now
        weight = exp((now - self._origin) / DECAY)
        if weight > 1e100:  # rescale: only ratios matter
            for i in range(N_BUCKETS):
                self._buckets[i] /= weight
            self._total /= weight
            self._origin = now
            weight = 1.0
        self._buckets[self._bucket(latency)] += weight
        self._total += weight

    cdef inline int _bucket(self, double latency):
        if latency <= LOW:
            return 0
        cdef int i = <int>(log(latency / LOW) / log(GROWTH))
        return N_BUCKETS - 1 if i >= N_BUCKETS else i

    cpdef double estimate(self, double now):
        """The running estimate of the quantile (seconds), or -1 while there are too few recent samples."""
        cdef double weight, target, seen = 0.0
        cdef int i
        if self.quantile <= 0.0 or self._total <= 0.0:
            return -1.0
        weight = exp((now - self._origin) / DECAY)  # today's weight of one sample
        if self._total / weight < MIN_SAMPLES:
            return -1.0
        target = self.quantile * self._total
        for i in range(N_BUCKETS):
            seen += self._buckets[i]
            if seen >= target:
                return LOW * GROWTH ** (i + 0.5)  # the bucket's geometric middle
        return HIGH

    cpdef double delay(self, double now):
        """The delay before the next hedge: the estimate, never below the config's hedgingDelay."""
        cdef double q = self.estimate(now)
        return q if q > self.floor else self.floor

    # -- the budget --------------------------------------------------------------------------------------------

    cdef void call_started(self):
        if self.max_extra_load >= 0.0:
            self._tokens += self.max_extra_load
            if self._tokens > self._cap:
                self._tokens = self._cap

    cdef bint take_hedge(self):
        """Whether a hedge may be sent now (and pay for it)."""
        if self.max_extra_load < 0.0:
            return True
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.budget_stopped += 1
        return False

    @property
    def tokens(self):
        return self._tokens
