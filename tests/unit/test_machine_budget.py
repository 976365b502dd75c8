"""grpc_retry.retry_budget: the core's RetryBudget in its two forms, the option as read from its JSON, and the call
machine's use of it (retries and hedges counted, transparent retries not; a refused retry ends the call with its
last status, a refused hedge leaves the call to the attempts it has), driven by scripted events."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_machine import OK, UNAVAILABLE, machine, names

from grpc_retry._budget import RetryBudgetSettings, budget_for, parse_retry_budget
from grpc_retry._core import CallPolicy, RetryBudget

INF = math.inf


def retries(max_attempts: int = 5) -> CallPolicy:
    return CallPolicy(max_attempts, 0.01, 0.01, 1.0, (UNAVAILABLE,))


def hedges(max_attempts: int = 3, delay: float = 0.1) -> CallPolicy:
    return CallPolicy(max_attempts, 0.0, 0.0, 1.0, (UNAVAILABLE,), hedging_delay=delay)


# -- the rate form ----------------------------------------------------------------------------------------------

def test_the_rate_form_allows_percent_of_the_calls_in_its_window_and_the_floor_besides():
    budget = RetryBudget(False, 20.0, 0, 10.0, 1.0)
    for i in range(100):
        budget.call_started(i * 0.01)
    allowed = sum(budget.try_retry(1.0) for _ in range(50))
    assert allowed == 20 and budget.refused == 30
    floored = RetryBudget(False, 20.0, 10, 10.0, 1.0)
    for i in range(100):
        floored.call_started(i * 0.01)
    assert sum(floored.try_retry(1.0) for _ in range(50)) == 20  # (the floor's 10 were spent within the 20)
    idle = RetryBudget(False, 20.0, 10, 10.0, 1.0)  # no calls: only the floor, per its interval
    assert sum(idle.try_retry(0.5) for _ in range(15)) == 10
    assert sum(idle.try_retry(1.2) for _ in range(15)) == 0  # (the floor's window still holds those 10)
    assert sum(idle.try_retry(1.6) for _ in range(15)) == 10


def test_the_rate_window_forgets_the_calls_and_retries_older_than_its_interval():
    budget = RetryBudget(False, 50.0, 0, 10.0, 1.0)
    for _ in range(10):
        budget.call_started(0.0)
    assert sum(budget.try_retry(0.5) for _ in range(10)) == 5
    assert budget.calls_in_window == 10 and budget.retries_in_window == 5
    assert not budget.try_retry(9.9)
    assert not budget.try_retry(20.0)  # (its window rolled past them all)
    assert budget.calls_in_window == 0 and budget.retries_in_window == 0
    budget.call_started(20.0)
    budget.call_started(20.0)
    assert budget.try_retry(20.0) and not budget.try_retry(20.0)


@given(st.lists(st.tuples(st.floats(0, 0.99), st.booleans()), max_size=300))
def test_over_any_window_the_retries_stay_within_percent_of_the_calls_plus_the_floor(events):
    budget = RetryBudget(False, 20.0, 2, 1.0, 1.0)
    now, calls, allowed = 0.0, [], []
    for step, is_call in events:
        now += step
        if is_call:
            budget.call_started(now)
            calls.append(now)
        elif budget.try_retry(now):
            allowed.append(now)
    for start in [t for t in calls + allowed]:  # any 1 s window's retries: at most 20% of its calls, plus 2,
        inside = sum(start <= t < start + 0.9 for t in allowed)  # give or take the slots' width (a tenth)
        spanned = sum(start - 0.1 <= t < start + 1.0 for t in calls)
        assert inside <= 0.2 * spanned + 2 + 2


# -- the concurrency form -----------------------------------------------------------------------------------------

def test_the_concurrency_form_allows_percent_of_the_calls_in_flight_and_at_least_its_floor():
    budget = RetryBudget(True, 20.0, 3)
    for _ in range(30):
        budget.call_started(0.0)
    assert sum(budget.try_retry(0.0) for _ in range(10)) == 6 and budget.retries_in_flight == 6
    budget.retry_ended()
    assert budget.try_retry(0.0) and not budget.try_retry(0.0)
    quiet = RetryBudget(True, 20.0, 3)
    quiet.call_started(0.0)
    assert sum(quiet.try_retry(0.0) for _ in range(5)) == 3  # (20% of one call: the floor rules)
    for _ in range(3):
        quiet.retry_ended()
    quiet.call_ended()
    assert quiet.calls_in_flight == 0 and quiet.retries_in_flight == 0


# -- the call machine -------------------------------------------------------------------------------------------

def test_a_retry_over_budget_is_not_sent_and_the_call_ends_with_its_last_status():
    budget = RetryBudget(False, 0.0, 1, 10.0, 1.0)  # one retry per second, whatever the calls
    m = machine(retries())
    m.budget = budget
    assert names(m.start(0.0, b"q")) == [("START", 0, 0, 0)]
    assert names(m.status(0, UNAVAILABLE, "a", (), 0.1)) == [("TIMER", m.timer_at)]
    assert names(m.timer(m.timer_at)) == [("START", 1, 1, 1)]
    assert names(m.status(1, UNAVAILABLE, "b", (), 0.2)) == [("DELIVER", 1)]
    assert m.reason_name == "retry_budget" and m.policy.stats.refused_by_budget == 1
    assert budget.refused == 1


def test_a_hedge_over_budget_is_not_sent_and_the_call_waits_on_the_attempts_it_has():
    budget = RetryBudget(False, 0.0, 1, 10.0, 1.0)
    m = machine(hedges())
    m.budget = budget
    assert names(m.start(0.0, b"q")) == [("START", 0, 0, 0), ("TIMER", 0.1)]
    assert names(m.timer(0.1)) == [("START", 1, 1, 1), ("TIMER", 0.2)]
    assert names(m.timer(0.2)) == []  # the third attempt: over budget
    assert m.live == 2 and m.policy.stats.refused_by_budget == 1
    assert names(m.status(1, OK, None, (), 0.3)) == [("CANCEL", 0), ("DELIVER", 1)]


def test_transparent_retries_do_not_count():
    budget = RetryBudget(False, 0.0, 0, 10.0, 1.0)  # no retry at all
    m = machine(retries())
    m.budget = budget
    m.start(0.0, b"q")
    refused = "Received RST_STREAM with error code 7"
    assert names(m.status(0, UNAVAILABLE, refused, (), 0.1)) == [("START", 1, 1, 0)]
    assert budget.refused == 0 and budget.retries_in_window == 0


def test_the_concurrency_form_counts_a_retry_from_its_decision_to_its_end():
    budget = RetryBudget(True, 0.0, 1)  # one retry in flight at a time
    first, second = machine(retries()), machine(retries())
    first.budget = second.budget = budget
    first.start(0.0, b"q")
    second.start(0.0, b"q")
    assert budget.calls_in_flight == 2
    first.status(0, UNAVAILABLE, "a", (), 0.1)  # its retry, in its backoff: in flight
    assert budget.retries_in_flight == 1
    assert names(second.status(0, UNAVAILABLE, "a", (), 0.1)) == [("DELIVER", 0)]  # over: ends as it is
    assert second.reason_name == "retry_budget" and budget.calls_in_flight == 1
    first.timer(0.2)
    assert budget.retries_in_flight == 1
    first.status(1, OK, None, (), 0.3)
    assert budget.retries_in_flight == 0 and budget.calls_in_flight == 0


def test_a_call_that_ends_in_its_backoff_gives_its_retry_back():
    budget = RetryBudget(True, 0.0, 1)
    m = machine(retries())
    m.budget = budget
    m.start(0.0, b"q")
    m.status(0, UNAVAILABLE, "a", (), 0.1)
    assert budget.retries_in_flight == 1
    m.cancel(1, 0.101)
    assert budget.retries_in_flight == 0 and budget.calls_in_flight == 0


# -- the option ---------------------------------------------------------------------------------------------------

def test_the_option_reads_either_form_with_gep_3388s_and_envoys_defaults():
    assert parse_retry_budget("{}") == RetryBudgetSettings(False, 20.0, 10, 10.0, 1.0)
    assert parse_retry_budget(json.dumps({"budget": {"percent": 5, "interval": "30s"},
                                          "minRetryRate": {"count": 0, "interval": "2s"}})) == \
        RetryBudgetSettings(False, 5.0, 0, 30.0, 2.0)
    assert parse_retry_budget({"budgetPercent": 25.5}) == RetryBudgetSettings(True, 25.5, 3)
    assert parse_retry_budget(b'{"minRetryConcurrency": "7"}') == RetryBudgetSettings(True, 20.0, 7)
    assert parse_retry_budget(None) is None


@pytest.mark.parametrize("value, words", [
    ({"budget": {"percent": 101}}, "budget.percent: must be from 0 to 100"),
    ({"budget": {"interval": "0.5s"}}, "budget.interval: must be from 1s to 1h"),
    ({"budget": {"interval": "3601s"}}, "budget.interval: must be from 1s to 1h"),
    ({"minRetryRate": {"count": -1}}, "minRetryRate.count: must be at least 0"),
    ({"minRetryRate": {"count": 1.5}}, "minRetryRate.count: must be an integer"),
    ({"budgetPercent": -3}, "budgetPercent: must be from 0 to 100"),
    ({"minRetryConcurrency": -1}, "minRetryConcurrency: must be at least 0"),
    ({"budgetPercent": 20, "budget": {"percent": 20}}, "one form or the other"),
    ({"budget": {"percnt": 20}}, "budget.percnt: unknown key"),
    ({"budgetPrecent": 20}, "budgetPrecent: unknown key"),
    ("[1]", "must be an object"),
    ("{", "not JSON"),
    (20, "must be a JSON object"),
])
def test_a_bad_budget_raises_naming_its_field(value, words):
    with pytest.raises(ValueError) as raised:
        parse_retry_budget(value)
    assert "grpc_retry.retry_budget" in str(raised.value) and words in str(raised.value)


def test_channels_to_one_target_with_the_same_settings_share_a_budget():
    settings = RetryBudgetSettings(True, 20.0, 3)
    assert budget_for("a:1", settings) is budget_for("a:1", RetryBudgetSettings(True, 20.0, 3))
    assert budget_for("a:1", settings) is not budget_for("b:1", settings)
    assert budget_for("a:1", settings) is not budget_for("a:1", RetryBudgetSettings(True, 30.0, 3))
    assert budget_for("a:1", None) is None
