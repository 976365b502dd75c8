"""grpc_retry.retry_budget against real grpcio servers on loopback, through both APIs: in an outage the attempts
the servers see stay within the budget (where the channel without one sends every attempt its policy allows);
with few failures calls still succeed; the concurrency form bounds the retries the servers see at once; hedges
are limited the same way; a bad budget raises at channel creation."""

from __future__ import annotations

import json
from concurrent import futures
from typing import Any, List

import grpc
import pytest
from support.backend import UNARY, Backend, Step, fail
from support.clients import ECHO_SERVICE, retry_options, retry_policy

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
BUDGET = "grpc_retry.retry_budget"


def target(backends: List[Backend]) -> str:
    return "ipv4:" + ",".join(b.target for b in backends)


def attempts(backends: List[Backend]) -> List[Any]:
    return [a for b in backends for a in b.attempts_of(UNARY)]


def budgeted(budget: Any, max_attempts: int = 5) -> List[Any]:
    return retry_options(retry_policy(max_attempts=max_attempts, initial="0.001s", maximum="0.001s"),
                         options=[(BUDGET, json.dumps(budget))])


def test_in_an_outage_the_budget_keeps_attempts_per_call_within_percent_and_floor(client, backends):
    for b in backends:
        b.fallback(UNARY, lambda i: fail())
    # Windows as long as the test: every retry counts against every call.
    ch = client.channel(target(backends), budgeted({"budget": {"percent": 20, "interval": "60s"},
                                                    "minRetryRate": {"count": 5, "interval": "60s"}}))
    calls = 60
    assert all(ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE for _ in range(calls))
    seen = len(attempts(backends))
    assert calls < seen <= calls * 1.2 + 5, seen
    stats = ch.channel.retry_stats()[UNARY]  # (each call ended refused, or at its last attempt)
    assert stats.refused_by_budget + stats.stopped_by_attempt_limit == calls and stats.refused_by_budget > 0
    # The same outage without a budget: every attempt the policy allows.
    plain = client.channel(target(backends), retry_options(retry_policy(max_attempts=5, initial="0.001s",
                                                                        maximum="0.001s")))
    before = len(attempts(backends))
    assert all(plain.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE for _ in range(5))
    assert len(attempts(backends)) - before == 25


def test_with_few_failures_nearly_every_call_succeeds(client, backends):
    for b in backends:
        b.fallback(UNARY, lambda i: fail() if i % 10 == 3 else Step())
    ch = client.channel(target(backends), budgeted({}))  # (GEP-3388's defaults: 20% over 10 s, 10 a second)
    codes = [ch.unary(UNARY, b"x", timeout=10).code for _ in range(90)]
    assert codes.count(OK) == 90


def test_the_concurrency_form_bounds_the_retries_in_flight_at_once(client, backends):
    for b in backends:
        b.fallback(UNARY, lambda i: fail(wait=0.15))
    ch = client.channel(target(backends), budgeted({"budgetPercent": 0, "minRetryConcurrency": 2}, max_attempts=3))
    with futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: ch.unary(UNARY, b"x", timeout=10).code, range(8)))
    assert codes == [UNAVAILABLE] * 8
    retries = [a for a in attempts(backends) if a.previous is not None]
    assert retries
    most = max(sum(1 for b in retries if b.arrived <= a.arrived < (b.ended or a.arrived + 1)) for a in retries)
    assert most <= 2, most


def test_hedges_over_the_budget_are_not_sent(client, backends):
    for b in backends:
        b.fallback(UNARY, lambda i: Step(wait=0.2))
    policy = {"maxAttempts": 3, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"]}
    config = {"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "hedgingPolicy": policy}]}
    ch = client.channel(target(backends), [("grpc.service_config", json.dumps(config)),
                                           (BUDGET, json.dumps({"budgetPercent": 0, "minRetryConcurrency": 1}))])
    for _ in range(4):
        assert ch.unary(UNARY, b"x", timeout=10).code == OK
    assert len(attempts(backends)) == 8  # each call: its first attempt and one hedge, not two


@pytest.mark.parametrize("budget, words", [
    ('{"budget": {"percent": 101}}', "budget.percent: must be from 0 to 100"),
    ('{"budgetPercent": 20, "minRetryRate": {"count": 1}}', "one form or the other"),
])
def test_a_bad_budget_raises_at_channel_creation_naming_its_field(client, budget, words):
    with pytest.raises(ValueError) as raised:
        client.make_channel("localhost:1", [(BUDGET, budget)])
    assert BUDGET in str(raised.value) and words in str(raised.value)
