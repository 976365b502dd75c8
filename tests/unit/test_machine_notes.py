"""The call machine's notes (what the telemetry exports): taken only when asked for, in the order decided."""

from __future__ import annotations

from test_machine import INVALID_ARGUMENT, OK, UNAVAILABLE, hedging_policy, machine, retry_policy

from grpc_retry._core import (
    COMMIT_ANSWER,
    HEDGE,
    NOTE_BACKOFF,
    NOTE_COMMIT,
    NOTE_END,
    NOTE_HEDGE_NOW,
    NOTE_START,
    NOTE_STATUS,
    NOTE_STOP,
    ORIGINAL,
    REASONS,
    RETRY,
    RetryThrottle,
)


def test_no_notes_unless_asked():
    m = machine()
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 1.0)
    assert m.notes is None and m.take_notes() is None


def test_a_retried_call_notes_each_decision():
    m = machine(retry_policy(max_attempts=3))
    m.notes = []
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 1.0)
    assert m.take_notes() == [(NOTE_START, 0, 0, 0, ORIGINAL, float("inf")),
                              (NOTE_STATUS, 0, UNAVAILABLE), (NOTE_BACKOFF, 0, 0.5, 2, 3)]
    assert m.take_notes() is None  # taken: the next take has only what came since
    m.timer(1.5)
    m.status(1, INVALID_ARGUMENT, "bad", None, 2.0)
    assert m.take_notes() == [(NOTE_START, 1, 1, 1, RETRY, 1.5), (NOTE_STATUS, 1, INVALID_ARGUMENT),
                              (NOTE_END, REASONS.index("fatal_status"), -1, 1)]


def test_a_throttled_retry_notes_the_tokens():
    m = machine(retry_policy(max_attempts=3), throttle=RetryThrottle(2000, 100))
    m.notes = []
    m.start(0.0, b"x")
    m.status(0, UNAVAILABLE, "x", None, 1.0)
    notes = m.take_notes()
    assert notes[1:] == [(NOTE_STATUS, 0, UNAVAILABLE), (NOTE_STOP, REASONS.index("throttled"), 1.0),
                         (NOTE_END, REASONS.index("throttled"), -1, 0)]


def test_a_hedged_call_notes_hedges_and_the_commit():
    m = machine(hedging_policy(max_attempts=3, delay=1.0))
    m.notes = []
    m.start(0.0, b"x")
    m.timer(1.0)                                   # the first hedge, after the delay
    m.status(1, UNAVAILABLE, "x", None, 1.25)      # non-fatal: the next hedge now
    m.headers(0, 1.5)                              # the original answers: it commits
    m.status(0, OK, "", None, 1.6)
    assert m.take_notes() == [
        (NOTE_START, 0, 0, 0, ORIGINAL, float("inf")), (NOTE_START, 1, 1, 1, HEDGE, 1.0),
        (NOTE_STATUS, 1, UNAVAILABLE), (NOTE_HEDGE_NOW, 1), (NOTE_START, 2, 2, 2, HEDGE, 0.25),
        (NOTE_COMMIT, 0, COMMIT_ANSWER), (NOTE_STATUS, 0, OK), (NOTE_END, REASONS.index("ok"), -1, 0)]
