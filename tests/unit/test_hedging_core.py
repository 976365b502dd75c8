"""The compiled HedgingCall alone: scripted timelines with an exact clock, and hypothesis-driven interleavings of
hedge timers, statuses, commits, overflow, cancel and the deadline."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from grpc_retry._core import BufferPool, CallPolicy, HedgingCall, RetryThrottle

OK, CANCELLED, INVALID_ARGUMENT, DEADLINE_EXCEEDED, UNAVAILABLE = 0, 1, 3, 4, 14
INF = math.inf
STOP = (("grpc-retry-pushback-ms", "-1"),)


def hedging(max_attempts=3, delay=1.0, codes=(UNAVAILABLE,), throttle=None, pool=None, per_rpc=1 << 20,
            deadline=INF):
    policy = CallPolicy(max_attempts, retryable_codes=codes, hedging_delay=delay)
    return HedgingCall(policy, throttle, pool or BufferPool(1 << 24), per_rpc, deadline)


def start_due(call, now):
    """What a driver does at `now`: begin every attempt that is due; returns their indices."""
    started = []
    while call.hedge_due(now):
        started.append(call.begin_attempt(now))
    return started


def test_original_at_once_then_one_hedge_per_delay():
    c = hedging(max_attempts=3, delay=0.5)
    assert start_due(c, 0.0) == [0]
    assert c.next_hedge_at == 0.5
    assert start_due(c, 0.49) == []
    assert start_due(c, 0.5) == [1]
    assert c.next_hedge_at == 1.0
    assert start_due(c, 1.0) == [2]
    assert c.next_hedge_at == INF and start_due(c, 9.0) == []
    assert c.live == 3


def test_zero_delay_starts_every_attempt_at_once():
    c = hedging(max_attempts=4, delay=0.0)
    assert start_due(c, 0.0) == [0, 1, 2, 3]


def test_first_response_commits_and_wins():
    c = hedging()
    start_due(c, 0.0)
    start_due(c, 1.0)
    c.on_commit(1)
    assert (c.winner, c.committed, c.next_hedge_at) == (1, True, INF)
    assert start_due(c, 5.0) == []
    c.on_status(0, CANCELLED, None, 1.1)  # the loser, cancelled by the driver: ignored
    assert not c.finished
    c.on_status(1, OK, None, 1.2)
    assert (c.finished, c.final) == (True, 1)


def test_non_fatal_status_brings_the_next_hedge_forward_then_delay_resumes():
    c = hedging(max_attempts=4, delay=1.0)
    start_due(c, 0.0)
    c.on_status(0, UNAVAILABLE, None, 0.2)
    assert c.next_hedge_at == 0.2
    assert start_due(c, 0.2) == [1]
    assert c.next_hedge_at == 1.2  # later ones resume at hedgingDelay
    assert not c.finished


def test_fatal_status_ends_the_call_with_it():
    c = hedging()
    start_due(c, 0.0)
    start_due(c, 1.0)
    c.on_status(1, INVALID_ARGUMENT, None, 1.5)
    assert (c.finished, c.final) == (True, 1)
    assert start_due(c, 2.0) == []


def test_all_failing_delivers_the_last_status_after_the_last_ends():
    c = hedging(max_attempts=3, delay=0.0)
    start_due(c, 0.0)
    c.on_status(2, UNAVAILABLE, None, 0.1)
    c.on_status(0, UNAVAILABLE, None, 0.2)
    assert not c.finished
    c.on_status(1, UNAVAILABLE, None, 0.3)
    assert (c.finished, c.final) == (True, 1)


def test_pushback_stop_stops_hedging_and_waits_for_the_live_ones():
    c = hedging(max_attempts=3, delay=1.0)
    start_due(c, 0.0)
    start_due(c, 1.0)
    c.on_status(0, UNAVAILABLE, STOP, 1.1)
    assert c.stopped and c.next_hedge_at == INF and not c.finished
    assert start_due(c, 5.0) == []
    c.on_status(1, UNAVAILABLE, None, 1.2)
    assert (c.finished, c.final) == (True, 1)


def test_pushback_ms_sets_the_next_hedge_then_delay_follows():
    c = hedging(max_attempts=3, delay=1.0)
    start_due(c, 0.0)
    c.on_status(0, UNAVAILABLE, (("grpc-retry-pushback-ms", "250"),), 0.1)
    assert c.next_hedge_at == 0.35 and not c.finished
    assert start_due(c, 0.3) == []
    assert start_due(c, 0.35) == [1]
    assert c.next_hedge_at == 1.35  # n + hedgingDelay


def test_throttle_lets_the_first_go_and_stops_later_hedges():
    throttle = RetryThrottle(2000, 100)  # maxTokens 2, threshold 1
    throttle.record_failure()
    throttle.record_failure()  # 0 tokens
    c = hedging(max_attempts=3, delay=0.0, throttle=throttle)
    assert start_due(c, 0.0) == [0]
    assert c.stopped
    c.on_status(0, UNAVAILABLE, None, 0.1)
    assert (c.finished, c.final) == (True, 0)


def test_throttle_counts_non_fatal_failures_and_successes():
    throttle = RetryThrottle(10000, 500)
    c = hedging(max_attempts=3, delay=0.0, throttle=throttle)
    start_due(c, 0.0)
    c.on_status(0, UNAVAILABLE, None, 0.1)
    c.on_status(1, INVALID_ARGUMENT, None, 0.1)  # fatal: not counted, ends the call
    assert throttle.tokens == 9.0
    c2 = hedging(throttle=throttle)
    start_due(c2, 0.0)
    c2.on_commit(0)
    c2.on_status(0, OK, None, 0.1)
    assert throttle.tokens == 9.5


def test_overflow_commits_to_the_hedge_that_sent_the_most():
    pool = BufferPool(1 << 20)
    c = hedging(max_attempts=3, delay=0.0, pool=pool, per_rpc=10)
    start_due(c, 0.0)
    assert c.add_message(b"12345")
    c.on_sent(0, 1)
    c.on_sent(2, 1)
    assert not c.add_message(b"6789012")  # 12 bytes > 10: overflow
    assert (c.committed, c.winner) == (True, 0)  # 0 and 2 sent one each: the earliest of them
    assert pool.used == 0 and c.buffered == 0


def test_overflow_prefers_the_furthest_hedge():
    c = hedging(max_attempts=3, delay=0.0, per_rpc=10)
    start_due(c, 0.0)
    c.add_message(b"aaaa")
    c.add_message(b"bbbb")
    c.on_sent(0, 1)
    c.on_sent(1, 2)
    c.add_message(b"cccc")
    assert c.winner == 1


def test_deadline_with_nothing_live_finishes_with_no_attempt():
    c = hedging(max_attempts=3, delay=1.0, deadline=2.0)
    start_due(c, 0.0)
    c.on_status(0, UNAVAILABLE, (("grpc-retry-pushback-ms", "5000"),), 0.5)
    assert not c.finished and c.next_hedge_at == 5.5
    assert start_due(c, 2.0) == []
    assert (c.finished, c.final) == (True, -1)


def test_transparent_retry_of_a_hedge_keeps_its_index_once_for_refused():
    c = hedging()
    start_due(c, 0.0)
    assert c.on_transparent(0, 1, 0.1)   # REFUSED: once per call
    assert not c.on_transparent(0, 1, 0.2)
    assert c.attempts == 1


# -- random interleavings -------------------------------------------------------------------------------

EVENTS = st.lists(st.tuples(
    st.sampled_from(["tick", "status", "commit", "message", "cancel"]),
    st.integers(0, 4),                                   # which attempt
    st.sampled_from([OK, UNAVAILABLE, INVALID_ARGUMENT, DEADLINE_EXCEEDED]),
    st.sampled_from([None, STOP, (("grpc-retry-pushback-ms", "100"),)]),
    st.floats(0.0, 0.7),                                 # time step
), max_size=40)


@settings(max_examples=400, deadline=None)
@given(EVENTS, st.integers(2, 5), st.sampled_from([0.0, 0.25, 1.0]), st.sampled_from([INF, 1.5, 3.0]),
       st.booleans())
def test_any_interleaving_ends_exactly_once_with_every_rule_kept(events, max_attempts, delay, deadline, throttled):
    pool = BufferPool(40)
    throttle = RetryThrottle(3000, 500) if throttled else None
    c = hedging(max_attempts=max_attempts, delay=delay, pool=pool, per_rpc=25, deadline=deadline,
                throttle=throttle)
    now = 0.0
    live, ended = set(), set()
    winner = None
    finishes = 0
    was_finished = False

    def observe():
        """Count the call's endings: it ends once, and never comes back."""
        nonlocal finishes, was_finished
        assert c.finished or not was_finished
        finishes += c.finished and not was_finished
        was_finished = c.finished

    def driver_step():
        for index in start_due(c, now):
            assert index == len(live) + len(ended) and index < max_attempts
            live.add(index)
        observe()

    def end(index, code, trailing=None):
        live.discard(index)
        ended.add(index)
        c.on_status(index, code, trailing, now)
        observe()

    driver_step()
    for kind, which, code, trailing, step in events:
        now += step
        if kind == "cancel":
            c.finish()  # the driver's own ending (application cancel)
            observe()
        elif kind == "message":
            c.add_message(b"m" * 9)
            for i in live:
                c.on_sent(i, len(c.replay))
        elif live:
            index = sorted(live)[which % len(live)]
            if kind == "commit":
                c.on_commit(index)
            else:
                end(index, code, trailing)
        if c.winner >= 0:
            # Once chosen, the winner never changes, and the driver cancels every other live attempt.
            assert winner in (None, c.winner)
            winner = c.winner
            for other in [i for i in live if i != winner]:
                end(other, CANCELLED)
        driver_step()
        # Invariants after every event.
        assert c.attempts <= max_attempts
        assert c.live == len(live)
        assert pool.used == c.buffered
        if c.committed:
            assert c.buffered == 0
        if c.finished:
            assert not c.hedge_due(now + 100)
            assert c.final == -1 or c.final in ended
            if winner is not None and c.final >= 0:
                assert c.final == winner
    # Drain: every live attempt ends (non-fatally) and time runs on: the call must end.
    while not c.finished:
        for index in sorted(live):
            now += 0.1
            end(index, UNAVAILABLE)
        now = max(now + 1.0, c.next_hedge_at if c.next_hedge_at != INF else now)
        driver_step()
        assert now < 1000, "the call never ended"
    assert finishes == 1
    assert pool.used == 0
