"""The call machine's rules for an attempt's first answer, driven by scripted events: headers with metadata commit
at once; empty headers (real ones, or a Trailers-Only response whose status is a moment behind) commit only once
HEADERS_GRACE of silence has followed them; and `headers_ahead` tells the method's HeadersWatch that the winner
answered well before its status, after which the method's first attempts show their headers first."""

from __future__ import annotations

import math

from test_attempt_timers import timed
from test_machine import OK, UNAVAILABLE, hedging_policy, machine, names

from grpc_retry._core import (
    EARLY_HEADERS,
    HEADERS_GRACE,
    WATCH_EVERY,
    WATCH_FIRST,
    CallPolicy,
    HeadersWatch,
    HedgingControl,
)

INF = math.inf
GRACE = HEADERS_GRACE


def test_empty_headers_then_a_trailers_only_status_are_retried():
    m = machine()
    m.start(0.0, b"x")
    assert m.headers(0, 0.1, True) == []
    assert not m.committed
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1 + GRACE / 2)) == [("TIMER", 0.1 + GRACE / 2 + 0.5)]
    assert m.state_name == "BACKOFF" and not m.headers_ahead


def test_silence_after_empty_headers_commits_the_call_when_the_status_comes():
    m = machine()
    m.start(0.0, b"x")
    m.headers(0, 0.1, True)
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1 + GRACE)) == [("COMMIT", 0), ("DELIVER", 0)]
    assert m.reason_name == "committed_then_failed"
    assert m.headers_ahead


def test_a_message_after_empty_headers_commits_at_once():
    m = machine(hedging_policy(delay=0.5))
    m.start(0.0, b"x")
    m.headers(0, 0.1, True)
    assert names(m.message(0, 0.11)) == [("TIMER", INF), ("COMMIT", 0)]
    assert not m.headers_ahead


def test_an_attempt_out_alone_needs_no_timer_for_its_silence_the_hedge_timer_sees_it():
    m = machine(hedging_policy(delay=0.5))
    assert names(m.start(0.0, b"x")) == [("START", 0, 0, 0), ("TIMER", 0.5)]
    assert m.headers(0, 0.1, True) == []
    # The next hedge is due, but attempt 0's silence has lasted: it answered, and no hedge goes out.
    assert names(m.timer(0.5)) == [("COMMIT", 0)]
    assert (m.state_name, m.counted, m.headers_ahead) == ("COMMITTED", 1, True)


def test_a_hedge_going_out_arms_the_timer_for_the_silence_of_the_attempt_before_it():
    m = machine(hedging_policy(delay=0.1))
    m.start(0.0, b"x")
    m.headers(0, 0.08, True)
    # The hedge is due before the silence has lasted: it goes, and the silence gets the timer (the next hedge
    # would come later).
    assert names(m.timer(0.1)) == [("START", 1, 1, 1), ("TIMER", 0.08 + GRACE)]
    assert names(m.timer(0.08 + GRACE)) == [("COMMIT", 0), ("CANCEL", 1)]


def test_empty_headers_among_live_hedges_arm_the_timer_at_once():
    m = machine(hedging_policy(delay=0.1))
    m.start(0.0, b"x")
    m.timer(0.1)
    assert names(m.headers(1, 0.12, True)) == [("TIMER", 0.12 + GRACE)]
    assert m.headers(1, 0.13, True) == []  # told again: its silence still runs from the first
    # Attempt 0's message comes within the grace: attempt 0 wins.
    assert names(m.message(0, 0.15)) == [("TIMER", INF), ("COMMIT", 0), ("CANCEL", 1)]


def test_a_hedge_failing_after_another_attempts_silence_lasted_commits_to_that_attempt():
    m = machine(hedging_policy(delay=0.1))
    m.start(0.0, b"x")
    m.headers(0, 0.08, True)
    m.timer(0.1)
    # Attempt 1's status arrives before the timer for attempt 0's silence: attempt 0 has answered, so the
    # non-fatal status brings no hedge forward.
    assert names(m.status(1, UNAVAILABLE, "x", None, 0.2)) == [("TIMER", INF), ("COMMIT", 0)]
    assert names(m.status(0, OK, "", None, 0.3)) == [("DELIVER", 0)]


def test_an_adaptive_hedging_sample_is_taken_when_the_empty_headers_came():
    hedge = HedgingControl(0.0, 0.9)
    m = machine(CallPolicy(3, retryable_codes=(UNAVAILABLE,), hedging_delay=0.5, hedge=hedge))
    m.start(0.0, b"x")
    m.headers(0, 0.1, True)
    m.timer(0.5)
    counts, _ = hedge.histogram()
    assert sum(counts.values()) == 1
    assert hedge.estimate(0.5) < 0.2  # the 0.1 s answer, not the 0.5 s at which the silence was seen


def test_empty_headers_stop_the_attempt_timer_without_committing():
    m = machine(timed(recv=0.25))
    m.start(0.0, b"q")
    assert names(m.headers(0, 0.1, True)) == [("TIMER", INF)]
    assert not m.committed
    # A Trailers-Only response after all: retried as any retryable status.
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.11)) == [("TIMER", 0.11 + 0.5)]


def test_headers_ahead_tells_headers_that_came_well_before_the_status():
    for status_at, ahead in ((0.1 + EARLY_HEADERS, True), (0.1 + EARLY_HEADERS / 2, False)):
        m = machine(hedging_policy(delay=0.5))
        m.start(0.0, b"x")
        m.headers(0, 0.1)
        m.status(0, OK, "", None, status_at)
        assert m.headers_ahead is ahead


def test_headers_that_come_with_the_response_are_not_ahead():
    m = machine(hedging_policy(delay=0.5))
    m.start(0.0, b"x")
    assert names(m.status(0, OK, "", None, 0.3, True)) == [("TIMER", INF), ("COMMIT", 0), ("DELIVER", 0)]
    assert not m.headers_ahead


def test_an_answer_told_with_an_ok_status_commits_first_only_under_hedging():
    retried = machine()
    retried.start(0.0, b"x")
    assert names(retried.status(0, OK, "", None, 0.2, True)) == [("DELIVER", 0)]
    hedged = machine(hedging_policy(delay=0.5))
    hedged.start(0.0, b"x")
    assert names(hedged.status(0, OK, "", None, 0.2, True)) == [("TIMER", INF), ("COMMIT", 0), ("DELIVER", 0)]


# -- the end record: what came with an attempt's status ---------------------------------------------------------
# Call shapes that see an attempt's headers and response only with its end tell them with its status: the machine
# decides from them whether it answered, as headers() or message() would have.


def test_a_failure_whose_headers_carried_metadata_answered_and_ends_the_call():
    m = machine()
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1, True)) == [("COMMIT", 0), ("DELIVER", 0)]
    assert m.reason_name == "committed_then_failed" and not m.headers_ahead


def test_a_failure_with_empty_headers_is_a_trailers_only_response_and_is_retried():
    m = machine()
    m.start(0.0, b"x")
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1, False, False)) == [("TIMER", 0.6)]
    assert m.state_name == "BACKOFF"


def test_an_ok_ends_the_call_whatever_came_with_it():
    for headers, response in ((False, False), (True, False), (False, True), (True, True)):
        m = machine()
        m.start(0.0, b"x")
        assert names(m.status(0, OK, None, None, 0.1, headers, response)) == [("DELIVER", 0)]
        assert m.reason_name == "ok"


def test_under_hedging_a_response_or_headers_with_the_end_commit_before_it():
    for headers, response in ((True, False), (False, True)):
        m = machine(hedging_policy(delay=0.5))
        m.start(0.0, b"x")
        assert names(m.status(0, OK, None, None, 0.1, headers, response)) == [
            ("TIMER", INF), ("COMMIT", 0), ("DELIVER", 0)]
    m = machine(hedging_policy(delay=0.5))
    m.start(0.0, b"x")
    assert names(m.status(0, OK, None, None, 0.1)) == [("TIMER", INF), ("DELIVER", 0)]


def test_a_hedge_that_failed_after_headers_with_metadata_is_the_calls_result():
    m = machine(hedging_policy(delay=0.1))
    m.start(0.0, b"x")
    m.timer(0.1)  # the hedge goes out
    assert names(m.status(1, UNAVAILABLE, "x", None, 0.2, True)) == [
        ("TIMER", INF), ("COMMIT", 1), ("CANCEL", 0), ("DELIVER", 1)]


def test_headers_with_the_end_after_empty_ones_answer_at_the_end_not_at_the_silence():
    m = machine()
    m.start(0.0, b"x")
    m.headers(0, 0.1, True)
    assert names(m.status(0, UNAVAILABLE, "x", None, 0.1 + 2 * GRACE, True)) == [("COMMIT", 0), ("DELIVER", 0)]
    assert not m.headers_ahead  # (the silence's verdict would have set it)


def test_a_first_message_commits_as_headers_do_but_is_not_headers_sent_ahead():
    # Both drivers report a message read before the call committed as a message: the same commit as headers with
    # metadata, but the time between it and the status says nothing of headers sent ahead of the response.
    for event in ("headers", "message"):
        m = machine()
        m.start(0.0, b"x")
        assert names(getattr(m, event)(0, 0.1)) == [("COMMIT", 0)]
        assert names(m.status(0, UNAVAILABLE, "x", None, 0.1 + 2 * EARLY_HEADERS)) == [("DELIVER", 0)]
        assert m.headers_ahead == (event == "headers")


def test_a_call_whose_server_sends_headers_ahead_tells_its_methods_watch():
    watch = HeadersWatch()
    assert not any(watch.first_whole() for _ in range(WATCH_FIRST)) and watch.first_whole()
    # A call's machine that sees its winner's headers well ahead of its status tells the watch: no more one batch.
    m = machine(hedging_policy(delay=0.5))
    m.watch = watch
    m.start(0.0, b"x")
    m.headers(0, 0.1, False)
    m.status(0, OK, None, None, 0.1 + EARLY_HEADERS * 2, True, True)
    assert m.headers_ahead and watch.early
    assert not any(watch.first_whole() for _ in range(WATCH_EVERY * 2))


def test_headers_with_their_response_leave_the_watch_as_it_was():
    watch = HeadersWatch()
    m = machine(hedging_policy(delay=0.5))
    m.watch = watch
    m.start(0.0, b"x")
    m.status(0, OK, None, None, 0.1, True, True)  # one batch: headers, response and status together
    assert not m.headers_ahead and not watch.early


def test_an_exchange_whose_timer_fired_with_headers_tells_the_watch():
    """A blocking exchange whose deadline was the call's perAttemptRecvTimeout ended with headers: its server sent
    them ahead of its response (no response by the timer), which the machine tells the method's watch."""
    for headers in (False, True):
        watch = HeadersWatch()
        m = machine(CallPolicy(3, 1.0, 5.0, 2.0, (UNAVAILABLE,), recv_timeout=0.25))
        m.watch = watch
        m.start(0.0, b"x")
        assert names(m.exchange_timer(0.25, headers)) == [("CANCEL", 0), ("TIMER", 0.75)]
        assert m.headers_ahead == watch.early == headers
