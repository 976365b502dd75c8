"""The compiled core alone: scripted event sequences and hypothesis, no I/O, exact clock and random."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpc_retry._core import FINISH, RETRY, BufferPool, CallPolicy, RetryCall, RetryThrottle, parse_pushback

UNAVAILABLE, INVALID_ARGUMENT, OK, ABORTED = 14, 3, 0, 10
INF = math.inf


def policy(max_attempts=4, initial=1.0, maximum=5.0, multiplier=2.0, codes=(UNAVAILABLE,)):
    return CallPolicy(max_attempts, initial, maximum, multiplier, codes)


def call(pol=None, throttle=None, pool=None, per_rpc=1 << 20, deadline=INF, rng=lambda: 0.5, enabled=True):
    return RetryCall(pol or policy(), throttle, pool or BufferPool(1 << 24), per_rpc, deadline, rng, enabled)


def run_failures(c, codes, now=0.0, trailing=None):
    """Begin an attempt and fail it with each code in turn; return the actions and delays."""
    out = []
    for code in codes:
        assert c.begin_attempt(now) >= 0
        action = c.on_status(code, trailing, now)
        out.append((action, round(c.delay, 9) if action == RETRY else None))
        if action == FINISH:
            break
    return out


def test_no_policy_call_is_committed_and_never_retries():
    c = call(CallPolicy())
    assert c.committed
    assert c.begin_attempt(0.0) == 0
    assert c.on_status(UNAVAILABLE, None, 0.0) == FINISH
    assert c.finished


def test_backoff_is_random_share_of_capped_exponential():
    # rng 0.5: n-th retry waits 0.5 * min(1 * 2^(n-1), 5)
    c = call(policy(max_attempts=5), rng=lambda: 0.5)
    assert run_failures(c, [UNAVAILABLE] * 5) == [
        (RETRY, 0.5), (RETRY, 1.0), (RETRY, 2.0), (RETRY, 2.5), (FINISH, None)]
    assert c.attempts == 5


def test_backoff_full_jitter_bounds():
    c = call(policy(max_attempts=3, initial=0.2, maximum=0.3, multiplier=3.0), rng=lambda: 0.999)
    assert run_failures(c, [UNAVAILABLE] * 3) == [(RETRY, 0.1998), (RETRY, 0.2997), (FINISH, None)]


def test_max_attempts_counts_the_original():
    c = call(policy(max_attempts=2))
    assert run_failures(c, [UNAVAILABLE] * 3) == [(RETRY, 0.5), (FINISH, None)]
    assert c.attempts == 2


def test_previous_attempts_numbering():
    c = call(policy(max_attempts=3))
    assert c.begin_attempt(0.0) == 0
    c.on_status(UNAVAILABLE, None, 0.0)
    assert c.begin_attempt(0.0) == 1
    c.on_status(UNAVAILABLE, None, 0.0)
    assert c.begin_attempt(0.0) == 2


def test_non_retryable_code_finishes():
    c = call()
    assert run_failures(c, [INVALID_ARGUMENT]) == [(FINISH, None)]


def test_ok_finishes_and_releases():
    pool = BufferPool(100)
    c = call(pool=pool)
    assert c.add_message(b"x" * 10)
    assert pool.used == 10
    c.begin_attempt(0.0)
    assert c.on_status(OK, None, 0.0) == FINISH
    assert pool.used == 0 and c.finished


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


def test_pushback_sets_exact_delay_and_resets_backoff():
    c = call(policy(max_attempts=5), rng=lambda: 0.5)
    assert run_failures(c, [UNAVAILABLE]) == [(RETRY, 0.5)]  # backoff step 1
    assert run_failures(c, [UNAVAILABLE]) == [(RETRY, 1.0)]  # backoff step 2
    assert run_failures(c, [UNAVAILABLE], trailing=(("grpc-retry-pushback-ms", "1234"),)) == [(RETRY, 1.234)]
    assert run_failures(c, [UNAVAILABLE]) == [(RETRY, 0.5)]  # reset to initialBackoff


@pytest.mark.parametrize("value", ["-1", "x", "99999999999"])
def test_stop_pushback_finishes(value):
    c = call()
    assert run_failures(c, [UNAVAILABLE], trailing=(("grpc-retry-pushback-ms", value),)) == [(FINISH, None)]


def test_pushback_does_not_exceed_max_attempts():
    c = call(policy(max_attempts=2))
    pb = (("grpc-retry-pushback-ms", "1"),)
    assert run_failures(c, [UNAVAILABLE, UNAVAILABLE], trailing=pb) == [(RETRY, 0.001), (FINISH, None)]


def test_pushback_on_non_retryable_code_does_not_retry():
    c = call()
    assert run_failures(c, [INVALID_ARGUMENT], trailing=(("grpc-retry-pushback-ms", "5"),)) == [(FINISH, None)]


def test_throttle_sequence_by_hand():
    # maxTokens 10, tokenRatio 0.1: threshold 5. Each counted failure -1, each success +0.1.
    t = RetryThrottle(10_000, 100)
    pol = policy(max_attempts=2)
    # Failures 1..4 leave 9, 8, 7, 6 tokens (> 5): retried. The 5th leaves 5 (not > 5): not retried.
    for expected_tokens in (9, 8, 7, 6):
        c = call(pol, throttle=t)
        assert run_failures(c, [UNAVAILABLE])[0][0] == RETRY
        assert t.tokens == expected_tokens
    c = call(pol, throttle=t)
    assert run_failures(c, [UNAVAILABLE]) == [(FINISH, None)]
    assert t.tokens == 5
    # One success: 5.1 > 5, retries come back.
    c = call(pol, throttle=t)
    c.begin_attempt(0.0)
    assert c.on_status(OK, None, 0.0) == FINISH
    assert t.milli_tokens == 5100
    c = call(pol, throttle=t)
    assert run_failures(c, [UNAVAILABLE])[0][0] == FINISH  # this failure brings it to 4.1
    assert t.milli_tokens == 4100


def test_throttle_counts_only_retryable_failures_and_stop_pushbacks():
    t = RetryThrottle(10_000, 100)
    run_failures(call(throttle=t), [INVALID_ARGUMENT])
    assert t.milli_tokens == 10_000
    run_failures(call(throttle=t), [INVALID_ARGUMENT], trailing=(("grpc-retry-pushback-ms", "-1"),))
    assert t.milli_tokens == 9_000
    run_failures(call(CallPolicy(), throttle=t), [UNAVAILABLE])  # calls without a policy do not count
    assert t.milli_tokens == 9_000


def test_throttle_bounds():
    t = RetryThrottle(1_500, 1_000)
    for _ in range(5):
        t.record_failure()
    assert t.milli_tokens == 0
    for _ in range(5):
        t.record_success()
    assert t.milli_tokens == 1_500


def test_headers_commit_the_call():
    c = call()
    c.begin_attempt(0.0)
    c.on_headers()
    assert c.committed
    assert c.on_status(UNAVAILABLE, None, 0.0) == FINISH


def test_per_rpc_overflow_commits_and_keeps_the_message_queued():
    pool = BufferPool(1 << 20)
    c = call(per_rpc=10, pool=pool)
    assert c.add_message(b"12345")
    assert c.add_message(b"12345")
    assert pool.used == 10
    assert not c.add_message(b"1")  # the 11th byte overflows
    assert c.committed and pool.used == 0
    assert list(c.replay) == [b"12345", b"12345", b"1"]  # still to be sent by the attempt
    c.begin_attempt(0.0)
    assert c.on_status(UNAVAILABLE, None, 0.0) == FINISH


def test_channel_pool_overflow_commits():
    pool = BufferPool(8)
    a, b = call(pool=pool), call(pool=pool)
    assert a.add_message(b"123456")
    assert not b.add_message(b"123")  # 6 + 3 > 8: b commits, a keeps its share
    assert b.committed and not a.committed and pool.used == 6
    a.finish()
    assert pool.used == 0


def test_trim_after_commit():
    c = call(per_rpc=4)
    c.add_message(b"ab")
    c.add_message(b"cdef")  # overflow -> commit
    c.trim_sent(1)
    assert c.replay_base == 1 and list(c.replay) == [b"cdef"]


def test_deadline_stops_retries_and_clips_delay():
    c = call(policy(initial=10.0, maximum=10.0), deadline=2.0, rng=lambda: 0.9)
    assert c.begin_attempt(0.0) == 0
    assert c.on_status(UNAVAILABLE, None, 1.0) == RETRY
    assert c.delay == pytest.approx(1.0)  # clipped from 9.0 to the deadline
    assert c.begin_attempt(2.0) == -1  # the driver then ends the call DEADLINE_EXCEEDED
    c2 = call(deadline=2.0)
    c2.begin_attempt(0.0)
    assert c2.on_status(UNAVAILABLE, None, 2.5) == FINISH


def test_disabled_retries():
    c = call(enabled=False)
    assert c.committed and c.max_attempts == 1
    assert run_failures(c, [UNAVAILABLE]) == [(FINISH, None)]


def test_events_after_finish_are_inert():
    c = call()
    c.finish()
    assert c.begin_attempt(0.0) == -1
    assert c.on_status(UNAVAILABLE, None, 0.0) == FINISH


# -- hypothesis: random interleavings keep the invariants ---------------------------------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("msg"), st.integers(0, 40)),
    st.tuples(st.just("status"), st.sampled_from([OK, UNAVAILABLE, ABORTED, INVALID_ARGUMENT]),
              st.sampled_from([None, "0", "15", "-1", "bad"])),
    st.tuples(st.just("headers")),
    st.tuples(st.just("finish")),
    st.tuples(st.just("tick"), st.floats(0, 3)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=4), st.integers(2, 6), st.floats(0, 1, exclude_max=True))
def test_invariants_under_random_events(scripts, max_attempts, r):
    pool = BufferPool(100)
    throttle = RetryThrottle(3_000, 500)
    pol = policy(max_attempts=max_attempts, initial=0.5, maximum=2.0, codes=(UNAVAILABLE, ABORTED))
    calls = [call(pol, throttle=throttle, pool=pool, per_rpc=60, deadline=8.0, rng=lambda: r)
             for _ in scripts]
    now = 0.0
    for c in calls:
        c.begin_attempt(now)
    for step in range(max(len(s) for s in scripts)):
        for c, script in zip(calls, scripts):
            if step >= len(script):
                continue
            ev = script[step]
            was_committed = c.committed
            if ev[0] == "msg":
                c.add_message(b"x" * ev[1])
            elif ev[0] == "status":
                trailing = None if ev[2] is None else (("grpc-retry-pushback-ms", ev[2]),)
                action = c.on_status(ev[1], trailing, now)
                if action == RETRY:
                    assert not was_committed and not c.finished
                    assert ev[1] in (UNAVAILABLE, ABORTED)
                    assert 0.0 <= c.delay <= max(2.0, 0.015)
                    assert now + c.delay <= 8.0 + 1e-9
                    if c.begin_attempt(now + c.delay) >= 0:
                        assert c.attempts <= max_attempts
                else:
                    assert c.finished
            elif ev[0] == "headers":
                c.on_headers()
                assert c.committed
            elif ev[0] == "finish":
                c.finish()
            else:
                now += ev[1]
            assert 0 <= throttle.milli_tokens <= 3_000
            assert c.attempts <= max_attempts
            # The pool holds exactly what uncommitted calls hold.
            assert pool.used == sum(x.buffered for x in calls)
            assert all(x.buffered == 0 for x in calls if x.committed)
            assert all(x.buffered <= 60 for x in calls)
    for c in calls:
        c.finish()
    assert pool.used == 0
