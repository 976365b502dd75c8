"""The call machine alone: scripted timelines with an exact clock and random source. No I/O. (Random event
sequences checked against the invariants every call must keep: test_machine_invariants.py.)"""

from __future__ import annotations

import math

import pytest

from grpc_retry._core import (
    ACTION_NAMES,
    PICK_FIRST,
    WRITE,
    BufferPool,
    CallMachine,
    CallPolicy,
    MachineError,
    Picker,
    RetryThrottle,
)

OK, CANCELLED, INVALID_ARGUMENT, DEADLINE_EXCEEDED, UNAVAILABLE = 0, 1, 3, 4, 14
READY, IDLE, TRANSIENT_FAILURE = 2, 0, 3
INF = math.inf
NOT_SENT_DETAILS = "failed to connect to all addresses; last error: UNAVAILABLE"
REFUSED_DETAILS = "Stream refused by server: RST_STREAM with error code 7"


def pushback(ms: str):
    return (("grpc-retry-pushback-ms", ms),)


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def retry_info_trailer(seconds: int, nanos: int) -> tuple:
    """grpc-status-details-bin: a google.rpc.Status whose details hold a RetryInfo (written by hand: the
    machine reads the wire format itself)."""
    duration = _varint(1 << 3) + _varint(seconds) + _varint(2 << 3) + _varint(nanos)
    any_ = _field(1, b"type.googleapis.com/google.rpc.RetryInfo") + _field(2, _field(1, duration))
    return (("grpc-status-details-bin", _field(3, any_)),)


def picker(size=3, state=READY, resolved=True) -> Picker:
    p = Picker(PICK_FIRST, size)
    for i in range(size):
        p.set_state(i, state)
    p.resolved = resolved
    return p


def retry_policy(max_attempts=3, initial=1.0, maximum=5.0, multiplier=2.0, codes=(UNAVAILABLE,)):
    return CallPolicy(max_attempts, initial, maximum, multiplier, codes)


def hedging_policy(max_attempts=3, delay=1.0, codes=(UNAVAILABLE,)):
    return CallPolicy(max_attempts, retryable_codes=codes, hedging_delay=delay)


def machine(policy=None, *, throttle=None, pool=None, pick=None, per_rpc=1 << 20, deadline=INF, rng=lambda: 0.5,
            enabled=True, wait_for_ready=False, unary=True) -> CallMachine:
    return CallMachine(policy or retry_policy(), throttle, pool or BufferPool(1 << 24), pick or picker(), per_rpc,
                       deadline, rng, enabled, wait_for_ready, unary)


def names(actions) -> list:
    """Actions with their names, WRITE without its bytes: easy to compare."""
    out = []
    for action in actions:
        kind = action[0]
        rest = action[1:3] if kind == WRITE else action[1:]
        out.append((ACTION_NAMES[kind],) + tuple(rest))
    return out


# -- A6's five kinds of response, under a retry policy ---------------------------------------------------------


def test_ok_delivers_at_once():
    m = machine()
    assert names(m.start(0.0, b"x")) == [("START", 0, 0, 0)]
    assert names(m.status(0, OK, "", None, 0.1)) == [("DELIVER", 0)]
    assert (m.state_name, m.reason_name, m.attempts, m.retries) == ("DONE", "ok", 1, 0)


def test_fatal_status_is_delivered():
    m = machine()
    m.start(0.0, b"x")
    assert names(m.status(0, INVALID_ARGUMENT, "bad", None, 0.1)) == [("DELIVER", 0)]
    assert m.reason_name == "fatal_status"


def test_retryable_backs_off_then_tries_another_address():
    # rng 0.5: the n-th retry waits 0.5 * min(1 * 2^(n-1), 5)
    m = machine(retry_policy(max_attempts=4))
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 1.0)) == [("TIMER", 1.5)]
    assert m.state_name == "BACKOFF"
    assert names(m.timer(1.5)) == [("START", 1, 1, 1)]  # a fired timer is disarmed
    assert names(m.status(1, UNAVAILABLE, "x", None, 2.0)) == [("TIMER", 3.0)]
    assert names(m.timer(3.0)) == [("START", 2, 2, 2)]
    assert names(m.status(2, UNAVAILABLE, "x", None, 4.0)) == [("TIMER", 6.0)]
    # Every address used: the picker falls back to the first READY one.
    assert names(m.timer(6.0)) == [("START", 3, 0, 3)]
    assert names(m.status(3, UNAVAILABLE, "x", None, 7.0)) == [("DELIVER", 3)]
    assert (m.reason_name, m.retries, m.counted) == ("attempts_exhausted", 3, 4)
    assert m.idle_time == pytest.approx(0.5 + 1.0 + 2.0)


def test_backoff_is_capped_at_max_backoff():
    m = machine(retry_policy(max_attempts=5, initial=1.0, maximum=1.5, multiplier=10.0), rng=lambda: 1.0)
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.0)) == [("TIMER", 1.0)]
    m.timer(1.0)
    assert names(m.status(1, UNAVAILABLE, "x", None, 1.0)) == [("TIMER", 2.5)]


def test_pushback_stop_ends_retrying():
    for value in ("-1", "abc", "007", ""):
        m = machine()
        m.start(0.0, b"x")
        assert names(m.status(0, UNAVAILABLE, "x", pushback(value), 0.0)) == [("DELIVER", 0)]
        assert m.reason_name == "pushback_stop"


def test_pushback_sets_the_delay_exactly_and_resets_the_backoff():
    m = machine(retry_policy(max_attempts=4))
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 0.0)  # backoff step 1: 0.5
    m.timer(0.5)
    assert names(m.status(1, UNAVAILABLE, "x", pushback("250"), 1.0)) == [("TIMER", 1.25)]
    m.timer(1.25)
    assert names(m.status(2, UNAVAILABLE, "x", None, 2.0)) == [("TIMER", 2.5)]  # step 1 again


def test_repeated_pushback_means_stop():
    m = machine()
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", pushback("1") + pushback("2"), 0.0)
    assert m.reason_name == "pushback_stop"


# -- the same five under hedging -------------------------------------------------------------------------------


def test_hedges_go_out_one_delay_apart_to_unused_addresses():
    m = machine(hedging_policy(max_attempts=3, delay=0.5))
    assert names(m.start(0.0, b"x")) == [("START", 0, 0, 0), ("TIMER", 0.5)]
    assert names(m.timer(0.5)) == [("START", 1, 1, 1), ("TIMER", 1.0)]
    assert names(m.timer(1.0)) == [("START", 2, 2, 2)]
    assert names(m.status(1, OK, "", None, 1.1)) == [("CANCEL", 0), ("CANCEL", 2), ("DELIVER", 1)]
    assert (m.reason_name, m.hedges, m.live) == ("ok", 2, 0)


def test_zero_delay_sends_every_hedge_at_once():
    m = machine(hedging_policy(max_attempts=3, delay=0.0))
    assert names(m.start(0.0, b"x")) == [("START", 0, 0, 0), ("START", 1, 1, 1), ("START", 2, 2, 2)]


def test_a_fatal_hedge_status_cancels_the_rest():
    m = machine(hedging_policy())
    m.start(0.0, b"x")
    m.timer(1.0)
    assert names(m.status(0, INVALID_ARGUMENT, "no", None, 1.5)) == [
        ("CANCEL", 1), ("TIMER", INF), ("DELIVER", 0)]
    assert m.reason_name == "fatal_status"


def test_a_non_fatal_hedge_status_brings_the_next_forward():
    m = machine(hedging_policy(max_attempts=3, delay=10.0))
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 1.0)) == [("START", 1, 1, 1), ("TIMER", 11.0)]


def test_when_every_hedge_fails_the_last_status_is_delivered():
    m = machine(hedging_policy(max_attempts=2, delay=0.0))
    m.start(0.0, b"x")
    assert m.status(1, UNAVAILABLE, "x", None, 1.0) == []
    assert names(m.status(0, UNAVAILABLE, "x", None, 2.0)) == [("DELIVER", 0)]
    assert m.reason_name == "attempts_exhausted"


def test_hedging_pushback_stop_sends_no_more_hedges():
    m = machine(hedging_policy(max_attempts=3, delay=0.5))
    m.start(0.0, b"x")
    m.timer(0.5)
    assert names(m.status(0, UNAVAILABLE, "x", pushback("-1"), 0.6)) == [("TIMER", INF)]
    assert names(m.status(1, UNAVAILABLE, "x", None, 0.7)) == [("DELIVER", 1)]
    assert m.reason_name == "pushback_stop"


def test_hedging_pushback_delays_the_next_hedge():
    m = machine(hedging_policy(max_attempts=3, delay=0.5))
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", pushback("2000"), 0.1)) == [("TIMER", 2.1)]
    assert m.state_name == "BACKOFF"
    assert names(m.timer(2.1)) == [("START", 1, 1, 1), ("TIMER", 2.6)]


def test_throttled_hedges_are_not_sent():
    throttle = RetryThrottle(2000, 100)  # 2 tokens: one failure leaves 1, not above half
    m = machine(hedging_policy(max_attempts=3, delay=0.5), throttle=throttle)
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1)) == [("TIMER", INF), ("DELIVER", 0)]
    assert m.reason_name == "throttled"


def test_throttle_stops_retries():
    throttle = RetryThrottle(3000, 100)
    m = machine(retry_policy(max_attempts=5), throttle=throttle)
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 0.0)  # 2 tokens left: above 1.5
    m.timer(0.5)
    assert names(m.status(1, UNAVAILABLE, "x", None, 1.0)) == [("DELIVER", 1)]  # 1 left
    assert m.reason_name == "throttled"


# -- commit -----------------------------------------------------------------------------------------------------


def test_headers_commit_and_a_later_failure_is_delivered():
    m = machine()
    m.start(0.0, b"x")
    assert names(m.headers(0, 0.1)) == [("COMMIT", 0)]
    assert m.state_name == "COMMITTED"
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.2)) == [("DELIVER", 0)]
    assert m.reason_name == "committed_then_failed"


def test_headers_reported_with_the_status_commit_too():
    m = machine()
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.2, True)) == [("COMMIT", 0), ("DELIVER", 0)]


def test_the_first_hedge_to_answer_wins():
    m = machine(hedging_policy(max_attempts=3, delay=0.1))
    m.start(0.0, b"x")
    m.timer(0.1)
    assert names(m.message(1, 0.15)) == [("TIMER", INF), ("COMMIT", 1), ("CANCEL", 0)]
    assert m.headers(1, 0.16) == []  # already its call
    assert names(m.status(1, OK, "", None, 0.2)) == [("DELIVER", 1)]


def stream_machine(policy=None, **kw) -> CallMachine:
    return machine(policy, unary=False, **kw)


def test_messages_are_replayed_in_order_one_at_a_time():
    m = stream_machine()
    assert names(m.start(0.0)) == [("START", 0, 0, 0)]
    assert names(m.send_message(b"a", 0.0)) == [("WRITE", 0, 0)]
    assert m.send_message(b"b", 0.0) == []  # one write at a time
    assert names(m.wrote(0, 0.1)) == [("WRITE", 0, 1)]
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.2)) == [("TIMER", 0.7)]
    assert names(m.timer(0.7)) == [("START", 1, 1, 1), ("WRITE", 1, 0)]
    assert names(m.wrote(1, 0.8)) == [("WRITE", 1, 1)]
    # The last message is going out: the half-close follows it at once, not a round trip later.
    assert names(m.half_close(0.8)) == [("HALF_CLOSE", 1)]
    assert m.wrote(1, 0.9) == []
    assert names(m.status(1, UNAVAILABLE, "x", None, 1.0)) == [("TIMER", 2.0)]
    # Replayed in full: the half-close goes with the last message, not a round trip after it.
    assert names(m.timer(2.0)) == [("START", 2, 2, 2), ("WRITE", 2, 0)]
    assert names(m.wrote(2, 2.1)) == [("WRITE", 2, 1), ("HALF_CLOSE", 2)]
    assert m.wrote(2, 2.2) == []
    assert m.buffered == 2


def test_overflow_commits_to_the_attempt_in_flight_and_frees_the_budget():
    pool = BufferPool(1 << 20)
    m = stream_machine(per_rpc=8, pool=pool)
    m.start(0.0)
    m.send_message(b"aaaa", 0.0)
    m.wrote(0, 0.0)
    m.send_message(b"bbbb", 0.0)
    assert pool.used == 8
    assert names(m.send_message(b"cccc", 0.0)) == [("COMMIT", 0)]
    assert (pool.used, m.buffered, m.committed) == (0, 0, True)
    assert m.base == 1  # the winner wrote the first: nothing keeps it
    assert names(m.wrote(0, 0.1)) == [("WRITE", 0, 2)]
    assert m.base == 2
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.2)) == [("DELIVER", 0)]


def test_channel_wide_overflow_commits_too():
    pool = BufferPool(4)
    m = stream_machine(pool=pool)
    m.start(0.0)
    m.send_message(b"aaaa", 0.0)
    assert names(m.send_message(b"b", 0.0)) == [("COMMIT", 0)]
    assert pool.used == 0


def test_hedging_overflow_commits_to_the_hedge_that_sent_the_most():
    m = stream_machine(hedging_policy(max_attempts=3, delay=0.1), per_rpc=5)
    m.start(0.0)
    m.send_message(b"aa", 0.0)
    m.timer(0.1)                     # hedge 1 starts, gets WRITE 0
    m.wrote(1, 0.1)
    m.send_message(b"bb", 0.1)       # WRITE 1 to hedge 1 (hedge 0 still writing 0)
    assert names(m.send_message(b"cc", 0.2)) == [("TIMER", INF), ("COMMIT", 1), ("CANCEL", 0)]


def test_overflow_during_backoff_ends_the_call_with_the_last_status():
    m = stream_machine(per_rpc=4)
    m.start(0.0)
    m.send_message(b"aaa", 0.0)
    m.status(0, UNAVAILABLE, "x", None, 0.1)
    assert names(m.send_message(b"bb", 0.2)) == [("TIMER", INF), ("DELIVER", 0)]
    assert m.reason_name == "committed_then_failed"


def test_overflow_before_any_attempt_commits_to_the_first():
    m = machine(per_rpc=2)
    assert names(m.start(0.0, b"xyz")) == [("START", 0, 0, 0), ("COMMIT", 0)]
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1)) == [("DELIVER", 0)]


def test_no_policy_commits_at_start_and_buffers_nothing():
    pool = BufferPool(1 << 20)
    m = stream_machine(CallPolicy(), pool=pool)
    assert names(m.start(0.0)) == [("START", 0, 0, 0), ("COMMIT", 0)]
    m.send_message(b"aaaa", 0.0)
    assert pool.used == 0


def test_enable_retries_0_is_one_plain_attempt():
    m = machine(retry_policy(), enabled=False)
    assert names(m.start(0.0, b"x")) == [("START", 0, 0, 0), ("COMMIT", 0)]
    assert names(m.status(0, UNAVAILABLE, NOT_SENT_DETAILS, None, 0.1)) == [("DELIVER", 0)]


# -- transparent retries ------------------------------------------------------------------------------------------


def test_refused_is_retried_once_at_once_elsewhere_uncounted():
    m = machine()
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, REFUSED_DETAILS, None, 0.1)) == [("START", 1, 1, 0)]
    assert (m.counted, m.transparent_retries) == (1, 1)
    # A second refusal is an ordinary (retryable) status.
    assert names(m.status(1, UNAVAILABLE, REFUSED_DETAILS, None, 0.2)) == [("TIMER", 0.7)]


def test_not_sent_goes_to_an_unused_address_until_none_is_left():
    m = machine(CallPolicy(), pick=picker(2))
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, NOT_SENT_DETAILS, None, 0.1)) == [("START", 1, 1, 0), ("COMMIT", 1)]
    assert names(m.status(1, UNAVAILABLE, NOT_SENT_DETAILS, None, 0.2)) == [("DELIVER", 1)]


@pytest.mark.parametrize("words", [NOT_SENT_DETAILS, "connections to all backends failing; last error: UNKNOWN"])
def test_the_picker_keeps_the_last_no_connection_details_for_calls_that_fail_fast(words: str):
    """pick_first's words (a subchannel), or round_robin's and xDS's (a grpcio channel on a whole target)."""
    p = picker(2)
    m = machine(CallPolicy(), pick=p)
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, words + " 0", None, 0.1)
    assert p.last_error == words + " 0"
    m.status(1, UNAVAILABLE, "other", None, 0.2)  # a backend's failure: not how a call that finds none is worded
    assert p.last_error == words + " 0"


def test_not_sent_with_wait_for_ready_waits_for_news_of_a_used_address():
    p = picker(1)
    m = machine(CallPolicy(), pick=p, wait_for_ready=True, deadline=10.0)
    m.start(0.0, b"x")
    generation = p.generation
    assert names(m.status(0, UNAVAILABLE, NOT_SENT_DETAILS, None, 0.1)) == [("WAIT", generation), ("TIMER", 10.0)]
    assert (m.state_name, m.winner) == ("COMMITTED", -1)  # the retry will carry the committed call
    p.generation += 1
    assert names(m.subchannels_changed(0.5)) == [("START", 1, 0, 0), ("COMMIT", 1), ("TIMER", INF)]


def test_transparent_retries_of_a_hedge_keep_its_index():
    m = machine(hedging_policy(max_attempts=2, delay=0.0))
    m.start(0.0, b"x")
    assert names(m.status(1, UNAVAILABLE, REFUSED_DETAILS, None, 0.1)) == [("START", 2, 2, 1)]


def test_no_transparent_retry_once_the_committed_stream_was_trimmed():
    m = stream_machine(CallPolicy())
    m.start(0.0)
    m.send_message(b"a", 0.0)
    m.wrote(0, 0.0)
    assert names(m.status(0, UNAVAILABLE, REFUSED_DETAILS, None, 0.1)) == [("DELIVER", 0)]


# -- addresses --------------------------------------------------------------------------------------------------


def test_no_address_fails_fast_once_resolved():
    m = machine(pick=picker(2, TRANSIENT_FAILURE))
    assert names(m.start(0.0, b"x")) == [("END", UNAVAILABLE)]
    assert m.reason_name == "no_address"


def test_no_address_before_resolution_waits():
    p = picker(0, resolved=False)
    m = machine(pick=p, deadline=5.0)
    assert names(m.start(0.0, b"x")) == [("WAIT", 0), ("TIMER", 5.0)]
    p.resize(1)
    p.set_state(0, IDLE)
    p.generation += 1
    assert names(m.subchannels_changed(1.0)) == [("START", 0, 0, 0), ("TIMER", INF)]
    assert m.idle_time == 1.0


def test_a_retry_with_every_backend_down_delivers_the_last_status():
    p = picker(2)
    m = machine(pick=p)
    m.start(0.0, b"x")
    p.set_state(0, TRANSIENT_FAILURE)
    p.set_state(1, TRANSIENT_FAILURE)
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1)) == [("TIMER", 0.6)]
    assert names(m.timer(0.6)) == [("DELIVER", 0)]
    assert m.reason_name == "no_address"


# -- deadline and cancel in every state --------------------------------------------------------------------------


def in_state(state: str) -> CallMachine:
    p = picker(1, resolved=False) if state == "WAITING" else picker()
    if state == "WAITING":
        p.set_state(0, TRANSIENT_FAILURE)
    m = stream_machine(deadline=10.0, pick=p, wait_for_ready=True)
    m.start(0.0)
    m.send_message(b"a", 0.0)
    if state == "BACKOFF":
        m.status(0, UNAVAILABLE, "x", None, 0.1)
    elif state == "COMMITTED":
        m.headers(0, 0.1)
    assert m.state_name == state
    return m


@pytest.mark.parametrize("state", ["ATTEMPTING", "BACKOFF", "WAITING", "COMMITTED"])
def test_cancel_in_every_state_ends_once_and_leaves_nothing(state):
    pool_used_before = 0
    m = in_state(state)
    actions = names(m.cancel(CANCELLED, 1.0))
    assert actions[-1] == ("END", CANCELLED)
    live_cancelled = [a for a in actions if a[0] == "CANCEL"]
    assert len(live_cancelled) == (1 if state in ("ATTEMPTING", "COMMITTED") else 0)
    assert (m.live, m.timer_at, m.waiting, m.buffered) == (0, INF, False, pool_used_before)
    with pytest.raises(MachineError):
        m.cancel(CANCELLED, 1.0)


@pytest.mark.parametrize("state", ["BACKOFF", "WAITING"])
def test_the_deadline_ends_a_call_with_no_attempt_in_flight(state):
    m = in_state(state)
    assert m.timer_at <= 10.0
    if m.timer_at < 10.0:
        m.timer(m.timer_at)  # the backoff ends; the next attempt runs until its own deadline
        m.status(1, UNAVAILABLE, "x", None, 9.0)
    assert names(m.timer(10.0))[-1] == ("END", DEADLINE_EXCEEDED)
    assert m.reason_name == "deadline"


def test_a_backoff_past_the_deadline_wakes_at_the_deadline():
    m = machine(retry_policy(initial=100.0, maximum=100.0), deadline=2.0)
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 1.0)) == [("TIMER", 2.0)]
    assert names(m.timer(2.0)) == [("END", DEADLINE_EXCEEDED)]


def test_a_call_started_past_its_deadline_ends_at_once():
    assert names(machine(deadline=1.0).start(1.0, b"x")) == [("END", DEADLINE_EXCEEDED)]


def test_impossible_events_raise():
    m = machine()
    with pytest.raises(MachineError):
        m.status(0, OK, "", None, 0.0)  # before start
    m.start(0.0, b"x")
    with pytest.raises(MachineError):
        m.timer(0.0)  # none armed
    with pytest.raises(MachineError):
        m.subchannels_changed(0.0)  # not waiting
    with pytest.raises(MachineError):
        m.send_message(b"y", 0.0)  # a unary request
    with pytest.raises(MachineError):
        m.status(5, OK, "", None, 0.0)  # no such attempt
    m.status(0, OK, "", None, 0.0)
    with pytest.raises(MachineError):
        m.headers(0, 0.0)


def test_statistics_count_retries_and_their_failures():
    policy = retry_policy(max_attempts=3)
    m = machine(policy)
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 0.0)
    m.timer(0.5)
    m.status(1, UNAVAILABLE, "x", None, 1.0)
    m.timer(2.0)
    m.status(2, OK, "", None, 3.0)
    stats = policy.stats.as_dict()
    assert (stats["retry_attempts"], stats["retry_attempts_failed"]) == (2, 1)
