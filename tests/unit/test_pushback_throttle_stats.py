"""The core's small parts on their own, and through the call machine: pushback parsing, the throttle's
arithmetic (A6's worked rules), and A6's retry statistics."""

import math

import pytest

from grpc_retry._core import BufferPool, CallMachine, CallPolicy, Picker, RetryThrottle, parse_pushback

OK, CANCELLED, INVALID_ARGUMENT, UNAVAILABLE = 0, 1, 3, 14
STOP = (("grpc-retry-pushback-ms", "-1"),)


def picker(size=3):
    p = Picker(0, size)
    for i in range(size):
        p.set_state(i, 2)
    p.resolved = True
    return p


def call(policy, throttle=None):
    return CallMachine(policy, throttle, BufferPool(1 << 20), picker(), 1 << 20, math.inf, lambda: 0.0)


def retried(m, code, trailing=None) -> bool:
    """Start m, fail its attempt with `code`: whether the machine plans another attempt."""
    m.start(0.0, b"x")
    m.status(0, code, "x", trailing, 0.0)
    return m.state_name != "DONE"


@pytest.mark.parametrize("value, expected", [
    ("0", 0), ("150", 150), ("2147483647", 2147483647), ("2147483648", -2), ("-1", -2), ("-0", -2),
    ("abc", -2), ("", -2), ("007", -2), ("1.5", -2), (" 1", -2), ("١٢", -2), (b"250", 250),
])
def test_parse_pushback_values(value, expected):
    assert parse_pushback((("grpc-retry-pushback-ms", value),)) == expected


def test_parse_pushback_absent_and_repeated():
    assert parse_pushback(None) == -1
    assert parse_pushback((("other", "1"),)) == -1
    assert parse_pushback((("grpc-retry-pushback-ms", "1"), ("grpc-retry-pushback-ms", "1"))) == -2


def test_throttle_sequence_by_hand():
    # maxTokens 10, tokenRatio 0.1: threshold 5. Each counted failure -1, each success +0.1.
    t = RetryThrottle(10_000, 100)
    policy = CallPolicy(2, 0.1, 1.0, 2.0, (UNAVAILABLE,))
    # Failures 1..4 leave 9, 8, 7, 6 tokens (> 5): retried. The 5th leaves 5 (not > 5): not retried.
    for expected_tokens in (9, 8, 7, 6):
        assert retried(call(policy, t), UNAVAILABLE)
        assert t.tokens == expected_tokens
    assert not retried(call(policy, t), UNAVAILABLE)
    assert t.tokens == 5
    # One success: 5.1 > 5, retries come back.
    m = call(policy, t)
    m.start(0.0, b"x")
    m.status(0, OK, "", None, 0.0)
    assert t.milli_tokens == 5100
    assert not retried(call(policy, t), UNAVAILABLE)  # this failure brings it to 4.1
    assert t.milli_tokens == 4100


def test_throttle_counts_only_retryable_failures_and_stop_pushbacks():
    t = RetryThrottle(10_000, 100)
    policy = CallPolicy(3, 0.1, 1.0, 2.0, (UNAVAILABLE,))
    retried(call(policy, t), INVALID_ARGUMENT)
    assert t.milli_tokens == 10_000
    retried(call(policy, t), INVALID_ARGUMENT, STOP)
    assert t.milli_tokens == 9_000
    retried(call(CallPolicy(), t), UNAVAILABLE)  # calls without a policy do not count
    assert t.milli_tokens == 9_000


def test_throttle_bounds():
    t = RetryThrottle(1_500, 1_000)
    for _ in range(5):
        t.record_failure()
    assert t.milli_tokens == 0
    for _ in range(5):
        t.record_success()
    assert t.milli_tokens == 1_500


def test_retries_and_their_failures_are_counted_per_policy():
    policy = CallPolicy(4, 0.0, 0.0, 1.0, (UNAVAILABLE,))
    m = call(policy)
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 0.0)
    m.status(1, UNAVAILABLE, "x", None, 0.0)
    m.status(2, OK, "", None, 0.0)
    stats = policy.stats.as_dict()
    assert stats["retry_attempts"] == 2
    assert stats["retry_attempts_failed"] == 1  # the first retry failed; the original is not a retry
    assert stats["histogram"][">=1"] == 1 and stats["histogram"][">=2"] == 1


def test_histogram_buckets_follow_a6():
    policy = CallPolicy(1000, 0.0, 0.0, 1.0, (UNAVAILABLE,))
    m = call(policy)
    m.start(0.0, b"x")
    for n in range(119):  # each failure starts the next retry at once (no backoff)
        m.status(n, UNAVAILABLE, "x", None, 0.0)
    hist = policy.stats.histogram()
    # retries 1..119: 1,2,3,4 one each; 5..9 five; 10..99 ninety; 100..119 twenty
    assert hist == {">=1": 1, ">=2": 1, ">=3": 1, ">=4": 1, ">=5": 5, ">=10": 90, ">=100": 20, ">=1000": 0}
    assert policy.stats.retries == 119


def test_hedges_count_as_retries_and_cancelled_losers_do_not_fail():
    policy = CallPolicy(3, retryable_codes=(UNAVAILABLE,), hedging_delay=0.0)
    m = call(policy)
    m.start(0.0, b"x")                          # all three at once
    m.status(1, UNAVAILABLE, "x", None, 0.1)    # hedge 1 failed
    m.headers(2, 0.2)                           # hedge 2 won: the original is cancelled, not failed
    m.status(2, OK, "", None, 0.3)
    assert policy.stats.as_dict()["retry_attempts"] == 2
    assert policy.stats.retries_failed == 1
