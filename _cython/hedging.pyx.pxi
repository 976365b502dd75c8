# Adaptive hedging, per method with a hedging policy (grpc_retry's own, off unless a channel option asks):
#
# - The delay before each next hedge follows a quantile of recent attempt latencies (time to the first response
#   headers or message): "The Tail at Scale" sends the backup request at the expected p95. The estimate is read
#   from fixed log-scale histograms (O(1) to record, O(buckets) to read, 1.5 KiB per method), between bucket edges
#   as if each bucket's samples were spread evenly in it. Older samples fade: by e every DECAY seconds, but by no
#   more than 1/KEEP per newer sample, so that a method called rarely still goes by its last ~KEEP answers. The
#   config's hedgingDelay is the floor.
# - Hedges beyond the first attempt are at most max_extra_load of the calls started over the last EXTRA_INTERVAL
#   seconds: the retry budget's rate form (budget.pyx.pxi), with no minimum rate and a credit of the share of
#   START_CALLS calls (while the delay is still learning, the first calls may hedge). A due hedge it refuses is not
#   sent; the call goes on with the attempts it has (Finagle's maxExtraLoad, on its RetryBudget too).
#
# Censored samples. An attempt cancelled because another answered first would have taken longer than its age, by
# how much is unknown. Leaving it out would bias the estimate low (the slow attempts are the ones hedges cut
# short: hedging earlier and earlier), so it counts at its age, the most it says. A hedge cancelled younger than
# the delay says nothing of whether the quantile is above the delay, and does not count.
#
# The edge of a gap. With a slow tail as big as the tail share (5% slow answers, the 0.95 quantile), the quantile
# is anywhere in the gap between the fast answers and the slow ones, and the estimate would swing with each
# percent of slow share: up to the slow answers (no hedging at all), or onto the censored samples, which sit at
# the delay plus the winning hedge's latency — the next delay is the last one plus a fast answer, and up it
# creeps. So when the quantile is reached only past a gap (GAP buckets with no answer) or only by counting
# censored samples, and the answers below reach within one tail share of it (at most MAX_SLACK), the estimate is
# the top of those answers (less the top OUTLIERS of a tail share, stray answers): a hedge as soon as the fast
# answers are over. A slow share beyond that is real, and the estimate goes where the quantile is.

from libc.math cimport exp, log

# N_BUCKETS and GAP: grpc_retry/_core.pxd
cdef double LOW = 50e-6        # the first bucket's lower edge, seconds; below it counts as the first bucket
cdef double HIGH = 100.0       # the last bucket's upper edge; above it counts as the last
cdef double GROWTH = exp(log(HIGH / LOW) / N_BUCKETS)   # each bucket's upper edge over its lower (~1.163)
cdef double _DECAY = 2.0       # seconds: a sample's weight falls by e in this long
cdef double _KEEP = 100.0      # ... but by no more than 1/KEEP per newer sample
cdef double _MIN_SAMPLES = 20.0  # fewer (weighted) samples than this: the estimate is not used yet
cdef double _MAX_SLACK = 0.05
cdef double _OUTLIERS = 0.05
cdef double _EXTRA_INTERVAL = 10.0
cdef long _START_CALLS = 1000
BUCKET_ERROR = GROWTH - 1.0
DECAY, KEEP, MIN_SAMPLES, MAX_SLACK, OUTLIERS, EXTRA_INTERVAL, START_CALLS = \
    _DECAY, _KEEP, _MIN_SAMPLES, _MAX_SLACK, _OUTLIERS, _EXTRA_INTERVAL, _START_CALLS


cdef class HedgingControl:
    def __init__(self, double floor, double quantile=0.0, double max_extra_load=-1.0):
        if not (0.0 <= quantile < 1.0):
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        self.floor = floor if floor > 0 else 0.0
        self.quantile = quantile
        self.max_extra_load = max_extra_load
        self.extra = None if max_extra_load < 0 else RetryBudget(
            False, max_extra_load * 100.0, 0, _EXTRA_INTERVAL, credit=<long>(max_extra_load * _START_CALLS))
        self._weight = 1.0
        self._last = -INFINITY

    # -- the delay ---------------------------------------------------------------------------------------------

    cpdef void record(self, double latency, double now):
        """An attempt answered `latency` seconds after it started."""
        if self.quantile > 0.0:
            self._answered[_bucket(latency)] += self._weigh(now)

    cpdef void record_censored(self, double age, double now):
        """An attempt cancelled `age` seconds after it started, because another answered first."""
        if self.quantile > 0.0 and age >= self.delay(now):
            self._censored[_bucket(age)] += self._weigh(now)

    cdef double _weigh(self, double now):
        """The weight of a sample recorded now, counted in the total."""
        cdef int i
        cdef double fade
        if now > self._last:
            if self._last != -INFINITY:
                # Rather than fade every older sample, weigh the new one more: only ratios matter.
                fade = exp((self._last - now) / _DECAY)
                self._weight /= fade if fade > 1.0 - 1.0 / _KEEP else 1.0 - 1.0 / _KEEP
                if self._weight > 1e100:
                    for i in range(N_BUCKETS):
                        self._answered[i] /= self._weight
                        self._censored[i] /= self._weight
                    self._total /= self._weight
                    self._weight = 1.0
            self._last = now
        self._total += self._weight
        return self._weight

    cpdef double estimate(self, double now):
        """The running estimate of the quantile (seconds), or -1 while there are too few recent samples."""
        cdef double target, enough, seen = 0.0, answers = 0.0, answers_seen = -1.0
        cdef int i, answers_top = -1
        if self.quantile <= 0.0 or self._total < _MIN_SAMPLES * self._weight:
            return -1.0
        target = self.quantile * self._total
        enough = target - min(1.0 - self.quantile, _MAX_SLACK) * self._total  # see "The edge of a gap"
        for i in range(N_BUCKETS):
            if seen + self._answered[i] + self._censored[i] >= target:
                if (seen + self._answered[i] < target or i > answers_top + GAP) and answers_seen >= enough:
                    return _level(self._answered, NULL, answers - _OUTLIERS * (1.0 - self.quantile) * self._total)
                return _level(self._answered, self._censored, target)
            seen += self._answered[i] + self._censored[i]
            answers += self._answered[i]
            if self._answered[i] >= 0.1 * self._weight:  # a tenth of a fresh answer: older ones have faded
                answers_top = i
                answers_seen = seen
        return HIGH

    def histogram(self):
        """(answered, censored): each bucket's weight in fresh samples, by the bucket's lower edge (seconds)."""
        return ({LOW * GROWTH ** i: self._answered[i] / self._weight for i in range(N_BUCKETS) if self._answered[i]},
                {LOW * GROWTH ** i: self._censored[i] / self._weight for i in range(N_BUCKETS) if self._censored[i]})

    cpdef double delay(self, double now):
        """The delay before the next hedge: the estimate, never below the config's hedgingDelay."""
        cdef double q = self.estimate(now)
        return q if q > self.floor else self.floor

    @property
    def budget_stopped(self):
        """Hedges due but not sent for max_extra_load."""
        return 0 if self.extra is None else self.extra.refused


cdef inline int _bucket(double latency):
    if latency <= LOW:
        return 0
    cdef int i = <int>(log(latency / LOW) / log(GROWTH))
    return N_BUCKETS - 1 if i >= N_BUCKETS else i


cdef double _level(double *answered, double *censored, double level):
    """Where the samples (answered, and censored unless NULL) add up to `level`, as if each bucket's were spread
    evenly in it."""
    cdef double here, seen = 0.0
    cdef int i
    for i in range(N_BUCKETS):
        here = answered[i] if censored == NULL else answered[i] + censored[i]
        if here > 0.0 and seen + here >= level:
            return LOW * GROWTH ** (i + (level - seen) / here)
        seen += here
    return HIGH
