"""The call machine's per-attempt timers (retryPolicy.perAttemptRecvTimeout) and server-directed backoff
(google.rpc.RetryInfo), driven by scripted events."""

from __future__ import annotations

import math

import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from hypothesis import given
from hypothesis import strategies as st
from test_machine import CANCELLED, OK, UNAVAILABLE, machine, names, pushback, retry_info_trailer, stream_machine

from grpc_retry._core import (
    NOTE_RECV_TIMEOUT,
    NOTE_SERVER_DELAY,
    REASONS,
    CallPolicy,
    RetryThrottle,
    parse_retry_info,
)

INF = math.inf
INVALID_ARGUMENT = 3


def timed(max_attempts=3, recv=0.25, codes=(UNAVAILABLE,), max_server_delay=30.0, initial=1.0) -> CallPolicy:
    return CallPolicy(max_attempts, initial, 5.0, 2.0, codes, recv_timeout=recv, max_server_delay=max_server_delay)


def retry_info(seconds: float, *, extra: bytes = b"") -> tuple:
    """Trailing metadata carrying a google.rpc.Status whose details hold a RetryInfo of `seconds`."""
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(round(seconds * 1e9))
    info = any_pb2.Any()
    info.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    other = any_pb2.Any()
    other.Pack(error_details_pb2.ErrorInfo(reason="BUSY"))
    status = status_pb2.Status(code=UNAVAILABLE, message="busy", details=[other, info])
    return (("grpc-status-details-bin", status.SerializeToString() + extra),)


# -- perAttemptRecvTimeout ----------------------------------------------------------------------------------------

def test_the_attempt_timer_runs_from_the_start_and_a_silent_attempt_is_retried_on_another_address():
    m = machine(timed())
    assert names(m.start(0.0, b"q")) == [("START", 0, 0, 0), ("TIMER", 0.25)]
    assert m.watched and m.recv_timeout == 0.25
    # Its timer fires: cancelled, and retried after a backoff as a retryable failure would be.
    assert names(m.timer(0.25)) == [("CANCEL", 0), ("TIMER", 0.25 + 0.5)]
    assert m.state_name == "BACKOFF" and m.recv_timeouts == 1
    assert names(m.timer(0.75)) == [("START", 1, 1, 1), ("TIMER", 1.0)]
    assert names(m.status(1, OK, None, (), 0.75)) == [("TIMER", INF), ("DELIVER", 1)]
    assert m.policy.stats.attempts_timed_out == 1


def test_headers_or_a_message_stop_the_attempt_timer():
    for event in ("headers", "message"):
        m = machine(timed())
        m.start(0.0, b"q")
        assert names(getattr(m, event)(0, 0.125)) == [("TIMER", INF), ("COMMIT", 0)]
        assert m.timer_at == INF
        assert names(m.status(0, UNAVAILABLE, "x", (), 5.0)) == [("DELIVER", 0)]


def test_the_last_attempt_timing_out_ends_the_call_cancelled_as_grpcio_does():
    m = machine(timed(max_attempts=2, initial=0.125))
    m.start(0.0, b"q")
    m.timer(0.25)
    m.timer(0.3125)  # the retry
    assert names(m.timer(0.5625)) == [("CANCEL", 1), ("END", CANCELLED)]
    assert m.recv_timeout_ended and REASONS[m.reason] == "attempt_timeout"
    assert m.policy.stats.stopped_by_attempt_limit == 1
    assert m.policy.stats.retries_failed == 1


def test_timed_out_attempts_count_whatever_the_retryable_codes_say():
    m = machine(timed(codes=()))
    m.start(0.0, b"q")
    assert names(m.timer(0.25))[0] == ("CANCEL", 0)
    assert m.state_name == "BACKOFF"
    # ... while a status the (empty) codes do not name is delivered
    m.timer(0.75)
    assert names(m.status(1, UNAVAILABLE, "x", (), 0.875)) == [("TIMER", INF), ("DELIVER", 1)]


def test_a_status_after_a_timed_out_attempt_is_the_one_delivered():
    m = machine(timed(max_attempts=2, initial=0.125))
    m.start(0.0, b"q")
    m.timer(0.25)
    m.timer(0.3125)
    assert names(m.status(1, UNAVAILABLE, "x", (), 0.375)) == [("TIMER", INF), ("DELIVER", 1)]
    assert not m.recv_timeout_ended


def test_the_throttle_counts_a_timed_out_attempt():
    throttle = RetryThrottle(2000, 100)  # 2 tokens: one failure leaves 1, not above half
    m = machine(timed(), throttle=throttle)
    m.start(0.0, b"q")
    assert names(m.timer(0.25)) == [("CANCEL", 0), ("END", CANCELLED)]
    assert m.recv_timeout_ended and REASONS[m.reason] == "throttled"


def test_the_deadline_bounds_the_backoff_after_a_timed_out_attempt():
    m = machine(timed(), deadline=0.5)
    m.start(0.0, b"q")
    assert names(m.timer(0.25)) == [("CANCEL", 0), ("TIMER", 0.5)]
    assert names(m.timer(0.5)) == [("END", 4)]


def test_an_attempt_committed_by_overflow_still_has_its_timer_and_ends_the_call():
    m = stream_machine(timed(), per_rpc=10)
    m.start(0.0)
    m.send_message(b"x" * 4, 0.0625)
    out = names(m.send_message(b"y" * 20, 0.125))  # overflows: committed to attempt 0, which has not answered
    assert ("COMMIT", 0) in out and ("TIMER", INF) not in out
    assert m.timer_at == 0.25
    assert names(m.timer(0.25)) == [("CANCEL", 0), ("END", CANCELLED)]
    assert m.recv_timeout_ended


def test_transparent_retries_get_their_own_timer():
    m = machine(timed())
    m.start(0.0, b"q")
    refused = "Stream refused by server: RST_STREAM with error code 7"
    assert names(m.status(0, UNAVAILABLE, refused, (), 0.125)) == [("START", 1, 1, 0), ("TIMER", 0.375)]


def test_an_early_timer_fires_nothing_and_is_armed_again():
    m = machine(timed())
    m.start(0.0, b"q")
    assert names(m.timer(0.2499)) == [("TIMER", 0.25)]
    assert m.live == 1


def test_no_timer_without_the_setting_or_when_retries_are_off():
    m = machine()
    assert names(m.start(0.0, b"q")) == [("START", 0, 0, 0)]
    assert not m.watched and m.recv_timeout == INF
    m = machine(timed(), enabled=False)
    assert names(m.start(0.0, b"q")) == [("START", 0, 0, 0), ("COMMIT", 0)]
    assert not m.watched


def test_notes_say_why_an_attempt_ended():
    m = machine(timed())
    m.notes = []
    m.start(0.0, b"q")
    m.timer(0.25)
    assert (NOTE_RECV_TIMEOUT, 0) in m.take_notes()


def test_a_recv_timeout_must_be_positive():
    with pytest.raises(ValueError):
        CallPolicy(3, 1.0, 5.0, 2.0, (UNAVAILABLE,), recv_timeout=0.0)


# -- RetryInfo ------------------------------------------------------------------------------------------------

def test_retry_info_sets_the_next_attempts_delay():
    m = machine(timed(recv=INF))
    m.notes = []
    m.start(0.0, b"q")
    assert names(m.status(0, UNAVAILABLE, "busy", retry_info(0.3), 1.0)) == [("TIMER", 1.3)]
    assert m.policy.stats.server_delays == 1
    assert (NOTE_SERVER_DELAY, 0, 0.3, True) in m.take_notes()


def test_the_pushback_trailer_wins_over_retry_info():
    m = machine(timed(recv=INF))
    m.start(0.0, b"q")
    assert names(m.status(0, UNAVAILABLE, "busy", pushback("100") + retry_info(3.0), 1.0)) == [("TIMER", 1.1)]
    assert m.policy.stats.server_delays == 0


def test_a_delay_past_the_deadline_or_the_cap_ends_the_call_at_once():
    m = machine(timed(recv=INF), deadline=2.0)
    m.start(0.0, b"q")
    assert names(m.status(0, UNAVAILABLE, "busy", retry_info(10.0), 0.1)) == [("DELIVER", 0)]
    assert REASONS[m.reason] == "server_delay"
    m = machine(timed(recv=INF, max_server_delay=5.0))
    m.start(0.0, b"q")
    assert names(m.status(0, UNAVAILABLE, "busy", retry_info(6.0), 0.1)) == [("DELIVER", 0)]


def test_retry_info_of_a_status_that_is_not_retried_changes_nothing():
    m = machine(timed(recv=INF))
    m.start(0.0, b"q")
    assert names(m.status(0, INVALID_ARGUMENT, "no", retry_info(0.3), 1.0)) == [("DELIVER", 0)]
    assert REASONS[m.reason] == "fatal_status"


def test_retry_info_is_read_from_grpcio_statuses_details():
    assert parse_retry_info(retry_info(0.3)) == pytest.approx(0.3)
    assert parse_retry_info(retry_info(2.5)) == 2.5
    assert parse_retry_info(()) == -1
    assert parse_retry_info((("grpc-status-details-bin", b""),)) == -1
    status = status_pb2.Status(code=UNAVAILABLE, message="x")
    assert parse_retry_info((("grpc-status-details-bin", status.SerializeToString()),)) == -1


@pytest.mark.parametrize("details", [
    b"\x1a\x05abc",           # truncated Any
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a varint that never ends
    b"\x1b",                  # a wire type protobuf does not have
    "text, not bytes",
])
def test_malformed_details_read_as_none(details):
    assert parse_retry_info((("grpc-status-details-bin", details),)) == -1


def test_a_negative_delay_reads_as_none():
    delay = duration_pb2.Duration(seconds=-1)
    info = any_pb2.Any()
    info.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=UNAVAILABLE, details=[info])
    assert parse_retry_info((("grpc-status-details-bin", status.SerializeToString()),)) == -1


def test_malformed_details_get_the_normal_backoff():
    m = machine(timed(recv=INF))
    m.start(0.0, b"q")
    assert names(m.status(0, UNAVAILABLE, "busy", (("grpc-status-details-bin", b"\x1a\x05abc"),), 1.0)) == \
        [("TIMER", 1.5)]


@given(st.binary(max_size=64))
def test_any_bytes_parse_without_error(data):
    assert parse_retry_info((("grpc-status-details-bin", data),)) >= -1
    assert parse_retry_info((("grpc-status-details-bin", retry_info(1.0)[0][1] + data),)) >= -1


def test_the_hand_written_trailer_of_the_property_tests_reads_as_protobuf_writes_it():
    assert parse_retry_info(retry_info_trailer(0, 200_000_000)) == pytest.approx(0.2)
    by_hand = retry_info_trailer(2, 500_000_000)[0][1]
    assert retry_info(2.5)[0][1].endswith(by_hand)  # (protobuf's: another detail first, then the same RetryInfo)


# -- a due timer that waits for what was queued before it (FLUSH) --------------------------------------------------

def test_a_due_timer_flushes_what_came_before_it_for_as_many_turns_as_allowed_then_fires():
    m = machine(timed())
    m.flush_turns = 4
    m.start(0.0, b"q")
    assert names(m.timer(0.25)) == [("FLUSH",)]
    assert [names(m.flushed(0.25)) for _ in range(3)] == [[("FLUSH",)]] * 3
    assert names(m.flushed(0.26)) == [("CANCEL", 0), ("TIMER", 0.26 + 0.5)]
    assert m.recv_timeouts == 1
    assert m.flushed(0.27) == []  # (a second turn's, after it fired: nothing)


def test_headers_told_by_a_flush_answered_in_time():
    for empty in (False, True):
        m = machine(timed())
        m.flush_turns = 4
        m.start(0.0, b"q")
        assert names(m.timer(0.25)) == [("FLUSH",)]
        m.headers(0, 0.25, empty)  # they came before the timer, and waited queued behind it
        assert m.timer_at == INF and m.flushed(0.25) == [] and m.recv_timeouts == 0


def test_a_timer_rearmed_by_what_a_flush_told_fires_later_after_its_own_flush():
    m = machine(timed())
    m.flush_turns = 1
    m.start(0.0, b"q")
    assert names(m.timer(0.25)) == [("FLUSH",)]
    assert names(m.status(0, UNAVAILABLE, "x", (), 0.25)) == [("TIMER", 0.75)]  # (its status came queued: a retry)
    assert m.flushed(0.25) == []
    assert names(m.timer(0.75)) == [("START", 1, 1, 1), ("TIMER", 1.0)]  # a backoff's timer: no attempt to flush for
    assert names(m.timer(1.0)) == [("FLUSH",)]
    assert names(m.flushed(1.0)) == [("CANCEL", 1), ("TIMER", 1.0 + 0.5 * 2)]


def test_without_flush_turns_a_due_timer_fires_at_once():
    m = machine(timed())
    m.start(0.0, b"q")
    assert names(m.timer(0.25)) == [("CANCEL", 0), ("TIMER", 0.75)]
