"""A6 retry statistics, kept by the compiled core per method."""

import math

from grpc_retry._core import BufferPool, CallPolicy, HedgingCall, RetryCall

UNAVAILABLE, OK, CANCELLED = 14, 0, 1


def retry_call(policy, rng=lambda: 0.0):
    return RetryCall(policy, None, BufferPool(1 << 20), 1 << 20, math.inf, rng)


def test_retries_and_their_failures_are_counted_per_policy():
    policy = CallPolicy(4, 0.1, 1.0, 2.0, (UNAVAILABLE,))
    c = retry_call(policy)
    for code in (UNAVAILABLE, UNAVAILABLE, OK):
        c.begin_attempt(0.0)
        c.on_status(code, None, 0.0)
    stats = policy.stats.as_dict()
    assert stats["retry_attempts"] == 2
    assert stats["retry_attempts_failed"] == 1  # the first retry failed; the original is not a retry
    assert stats["histogram"][">=1"] == 1 and stats["histogram"][">=2"] == 1


def test_histogram_buckets_follow_a6():
    policy = CallPolicy(1000, 0.0, 0.0, 1.0, (UNAVAILABLE,))
    c = retry_call(policy)
    for _ in range(120):
        c.begin_attempt(0.0)
        c.on_status(UNAVAILABLE, None, 0.0)
    hist = policy.stats.histogram()
    # retries 1..119: 1,2,3,4 one each; 5..9 five; 10..99 ninety; 100..119 twenty
    assert hist == {">=1": 1, ">=2": 1, ">=3": 1, ">=4": 1, ">=5": 5, ">=10": 90, ">=100": 20, ">=1000": 0}
    assert policy.stats.retries == 119


def test_hedges_count_as_retries_and_cancelled_losers_do_not_fail():
    policy = CallPolicy(3, retryable_codes=(UNAVAILABLE,), hedging_delay=0.0)
    c = HedgingCall(policy, None, BufferPool(1 << 20), 1 << 20, math.inf)
    while c.hedge_due(0.0):
        c.begin_attempt(0.0)
    c.on_status(1, UNAVAILABLE, None, 0.1)  # hedge 1 failed
    c.on_commit(2)
    c.on_status(0, CANCELLED, None, 0.2)    # the original, cancelled: neither a retry nor a failure
    c.on_status(2, OK, None, 0.3)
    assert policy.stats.as_dict()["retry_attempts"] == 2
    assert policy.stats.retries_failed == 1
