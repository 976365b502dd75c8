"""What the single call machine promises across its two drivers, against real servers: a call progresses
whether or not anyone waits on it, a hedged unary call commits to the first hedge with response headers, and
the same scenario seen through both APIs makes the servers see the same attempts (no drift)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import grpc
import pytest
from support.backend import SERVER_STREAM, UNARY, Backend, Step, fail, pushback
from support.clients import ECHO_SERVICE, Client

import grpc_retry
import grpc_retry._method
from grpc_retry._compiled import pure_python
from grpc_retry._core import CallMachine
from grpc_retry._timer import TIMERS
from grpc_retry.sync._driver import _Driver

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def retry_config(max_attempts=3, backoff="0.05s", codes=("UNAVAILABLE",)) -> str:
    return json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "retryPolicy": {
        "maxAttempts": max_attempts, "initialBackoff": backoff, "maxBackoff": backoff, "backoffMultiplier": 1,
        "retryableStatusCodes": list(codes)}}]})


def hedging_config(max_attempts=3, delay="0.1s") -> str:
    return json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "hedgingPolicy": {
        "maxAttempts": max_attempts, "hedgingDelay": delay, "nonFatalStatusCodes": ["UNAVAILABLE"]}}]})


def target(backends) -> str:
    return "ipv4:" + ",".join(b.target for b in backends)


def start_unawaited(client: Client, ch, kind: str, method: str, payload, timeout: float):
    """Make a call and leave it alone: nobody awaits, reads or waits on it. Returns its call object."""
    multicallable = ch.multicallable(kind, method)
    if client.api == "aio":
        async def make():
            return multicallable(payload, timeout=timeout)
        return ch.run(make())
    if kind == "unary":
        return multicallable.future(payload, timeout=timeout)
    return multicallable(payload, timeout=timeout)  # a response iterator nobody reads


def finish(client: Client, ch, kind: str, call):
    """Now attend to the call the application left alone: read its responses (a stream's status comes only
    after them, on grpcio too), then its code."""
    if client.api == "aio":
        async def code():
            if kind != "unary":
                async for _ in call:
                    pass
            return await call.code()
        return ch.run(code())
    if kind != "unary":
        for _ in call:
            pass
    return call.code()


# -- a call progresses whether or not anyone waits on it ----------------------------------------------------------


@pytest.mark.parametrize("kind,method,payload", [("unary", UNARY, b"x"), ("server_stream", SERVER_STREAM, b"s")])
def test_an_unawaited_call_retries_on_schedule(client, backends, kind, method, payload):
    backends[0].script(method, fail(UNAVAILABLE))
    ch = client.channel(target(backends), [("grpc.service_config", retry_config())])
    call = start_unawaited(client, ch, kind, method, payload, timeout=10)
    # The application does other work; the servers see the retry meanwhile.
    backends[1].wait_attempts(method, 1, timeout=5)
    assert backends[1].attempts_of(method)[0].previous == "1"
    time.sleep(0.5)
    assert finish(client, ch, kind, call) == OK
    assert [len(b.attempts_of(method)) for b in backends] == [1, 1, 0]


def test_an_unawaited_call_hedges_on_schedule(client, backends):
    backends[0].script(UNARY, Step(wait=0))  # holds its attempt until cancelled
    ch = client.channel(target(backends), [("grpc.service_config", hedging_config(delay="0.1s"))])
    started = time.monotonic()
    call = start_unawaited(client, ch, "unary", UNARY, b"x", timeout=10)
    backends[1].wait_attempts(UNARY, 1, timeout=5)
    assert 0.1 <= backends[1].attempts_of(UNARY)[0].arrived - started < 2
    time.sleep(0.5)
    assert finish(client, ch, "unary", call) == OK
    (held,) = backends[0].wait_ended(UNARY, 1)
    assert held.cancelled  # the hedge won while nobody waited: the original was cancelled then


def test_cancelling_an_unawaited_call_cancels_its_second_attempt_on_the_server(client, backends):
    backends[0].script(UNARY, fail(UNAVAILABLE))
    backends[1].script(UNARY, Step(wait=0))
    ch = client.channel(target(backends), [("grpc.service_config", retry_config())])
    call = start_unawaited(client, ch, "unary", UNARY, b"x", timeout=10)
    backends[1].wait_attempts(UNARY, 1, timeout=5)  # the retry is on the server, nobody awaited the call
    if client.api == "aio":
        assert ch.run(_cancel(call))
    else:
        assert call.cancel()
    (second,) = backends[1].wait_ended(UNARY, 1)
    assert second.cancelled
    assert finish(client, ch, "unary", call) == grpc.StatusCode.CANCELLED


async def _cancel(call) -> bool:
    return call.cancel()


# -- hedging commits on response headers ---------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [(("hedge", "first"),), ()], ids=["with-metadata", "empty"])
def test_a_hedged_unary_call_commits_to_the_first_hedge_with_headers(client, backends, headers):
    # Both hedges go at once. Backend 0 sends its headers at 0.1 s and its response a second later; backend 1
    # would answer at 0.3 s. The headers commit the call to backend 0 (A6): its response wins, the other hedge
    # is cancelled.
    backends[0].script(UNARY, Step(wait=0.1, headers=headers, headers_lead=1.0))
    backends[1].script(UNARY, Step(wait=0.3))
    ch = client.channel(target(backends), [("grpc.service_config", hedging_config(max_attempts=2, delay="0s"))])
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK and out.response == b"x"
    assert out.previous_attempts is None  # the original's result
    assert time.monotonic() - started >= 1.0
    if headers:
        assert out.initial == dict(headers)
    (hedge,) = backends[1].wait_ended(UNARY, 1)
    assert hedge.cancelled


# -- no drift: one table of scenarios, both APIs, the same attempts on the servers ----------------------------------


@dataclass
class Scenario:
    name: str
    config: str
    scripts: Tuple[Tuple[Step, ...], ...]  # per backend: its steps for the method
    kind: str = "unary"
    code: grpc.StatusCode = OK


SCENARIOS = [
    Scenario("retry-then-ok", retry_config(), ((fail(UNAVAILABLE),), (fail(UNAVAILABLE),), ())),
    Scenario("retry-exhausted", retry_config(), ((fail(UNAVAILABLE),),) * 3, code=UNAVAILABLE),
    Scenario("fatal", retry_config(), ((fail(grpc.StatusCode.INVALID_ARGUMENT),), (), ()),
             code=grpc.StatusCode.INVALID_ARGUMENT),
    Scenario("pushback-delay", retry_config(backoff="5s"), ((pushback(50),), (), ())),
    Scenario("pushback-stop", retry_config(), ((pushback(-1),), (), ()), code=UNAVAILABLE),
    Scenario("headers-commit", retry_config(), ((fail(UNAVAILABLE, headers=(("k", "v"),)),), (), ()),
             code=UNAVAILABLE),
    Scenario("stream-retry", retry_config(), ((fail(UNAVAILABLE),), (), ()), kind="server_stream"),
    Scenario("stream-message-commits", retry_config(), ((Step(code=UNAVAILABLE, responses=1),), (), ()),
             kind="server_stream", code=UNAVAILABLE),
    Scenario("hedge-non-fatal", hedging_config(delay="5s"), ((fail(UNAVAILABLE),), (), ())),
    Scenario("hedge-all-fail", hedging_config(delay="0s"),
             ((fail(UNAVAILABLE, wait=0.1),), (fail(UNAVAILABLE, wait=0.3),), (fail(UNAVAILABLE, wait=0.2),)),
             code=UNAVAILABLE),
    # Two attempts only: a third hedge would race the second's connection to an idle backend that answers OK.
    Scenario("hedge-fatal", hedging_config(max_attempts=2, delay="0.1s"),
             ((Step(wait=0),), (fail(grpc.StatusCode.INVALID_ARGUMENT),), ()),
             code=grpc.StatusCode.INVALID_ARGUMENT),
]


def _attempt_sequence(api: str, scenario: Scenario) -> Tuple[grpc.StatusCode, List[Tuple[int, Optional[str]]]]:
    backends = [Backend() for _ in range(3)]
    client = Client(api)
    try:
        method = UNARY if scenario.kind == "unary" else SERVER_STREAM
        for backend, steps in zip(backends, scenario.scripts, strict=False):
            backend.script(method, *steps)
        ch = client.channel(target(backends), [("grpc.service_config", scenario.config)])
        call: Callable = ch.unary if scenario.kind == "unary" else ch.server_stream
        out = call(method, b"x", timeout=10)
        # By backend: retries go 0, 1, 2 in turn; hedges sent at once may arrive in any order.
        seen = sorted((i, a.arrived, a.previous) for i, b in enumerate(backends) for a in b.attempts_of(method))
        return out.code, [(i, previous) for i, _, previous in seen]
    finally:
        client.close()
        for backend in backends:
            backend.stop()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_both_apis_make_the_same_attempts(scenario):
    aio = _attempt_sequence("aio", scenario)
    sync = _attempt_sequence("sync", scenario)
    assert aio[0] == scenario.code
    assert aio == sync


def test_a_message_read_commits_before_its_attempts_status_is_heard(client, backends):
    # The response and the status come together: the read of the message must reach the machine (a commit)
    # before the attempt's status does, or the call retries after the application has its message. The race
    # is the loop's (or the threads') order of the two: many calls, so that a wrong order shows.
    ch = client.channel(target(backends), [("grpc.service_config", retry_config())])
    for _ in range(40):
        backends[0].script(SERVER_STREAM, Step(code=UNAVAILABLE, responses=1))
        out = ch.server_stream(SERVER_STREAM, b"x", timeout=10)
        assert (out.code, out.responses) == (UNAVAILABLE, [b"x#0"])
    assert not backends[1].attempts_of(SERVER_STREAM)


# -- a call ends even when its machine fails ----------------------------------------------------------------------


class _Failing(CallMachine):
    """A call's machine whose events named in `failing` raise (a bug), once set; otherwise the machine. (The
    drivers type their machine: a stand-in must be one, its methods overridden as Python's are.)"""

    failing: tuple = ()

    def _check(self, event: str) -> None:
        if event in self.failing:
            raise RuntimeError("a bug in the call machine")

    def start(self, now, request=None):
        self._check("start")
        return super().start(now, request)

    def timer(self, now):
        self._check("timer")
        return super().timer(now)

    def headers(self, n, now, empty=False):
        self._check("headers")
        return super().headers(n, now, empty)

    def message(self, n, now):
        self._check("message")
        return super().message(n, now)

    def status(self, n, code, details, trailing_metadata, now, headers=False, response=False):
        self._check("status")
        return super().status(n, code, details, trailing_metadata, now, headers, response)


@pytest.mark.parametrize("event", ["backoff timer", "hedge's answer"])
def test_a_call_whose_machine_fails_on_a_callback_ends_internal(client, backends, caplog, event, monkeypatch):
    """Events that come on the timer thread or grpcio's (sync), or as loop callbacks (asyncio), where an exception
    would only be logged: the call ends INTERNAL instead of never, and its channel goes on serving."""
    if event == "backoff timer":
        backends[0].script(UNARY, fail(UNAVAILABLE))
        config, failing = retry_config(backoff="0.3s"), ("timer",)
    else:  # the answer (headers, message; on asyncio a response told with its status) of a hedged call's first
        # attempt, held until the machine is swapped
        answer = threading.Event()
        backends[0].script(UNARY, Step(gate=answer))
        config, failing = hedging_config(delay="5s"), ("headers", "message", "status")
    monkeypatch.setattr(grpc_retry._method, "CallMachine", _Failing)  # the calls' machines
    ch = client.channel(backends[0].target, [("grpc.service_config", config)])
    call = start_unawaited(client, ch, "unary", UNARY, b"x", timeout=10)
    call._machine.failing = failing  # before the event
    if event != "backoff timer":
        answer.set()
    assert finish(client, ch, "unary", call) == grpc.StatusCode.INTERNAL
    if client.api == "aio":
        async def details():
            return await call.details()
        assert ch.run(details()) == "grpc_retry internal error"
    else:
        assert call.details() == "grpc_retry internal error"
    assert "the call's machine failed" in caplog.text
    assert ch.unary(UNARY, b"y", timeout=5).response == b"y"


# A blocking hedged sync call's caller polls the attempts it makes (sync/_caller.py): its events
# come on that thread, grpcio's or the timer thread, which would only log an exception.


def _blocking_unary(ch, request, timeout=None):
    """A blocking call on a thread of its own, joined with a generous bound: (its result or what it raised, whether
    it ended within the bound)."""
    outcome = []

    def call():
        try:
            outcome.append(ch.unary_unary(UNARY)(request, timeout=timeout))
        except Exception as error:
            outcome.append(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(10)
    return (outcome[0] if outcome else None), not caller.is_alive()


@pytest.mark.parametrize("event", ["start", "headers", "status", "timer"])
def test_a_blocking_hedged_call_whose_machine_fails_ends_internal_once(backends, caplog, event, monkeypatch):
    """Whichever thread the event comes on, the caller gets INTERNAL (the non-blocking driver's words) at once,
    not the bug's exception, another status, or a wait for the next hedge (20 s); its attempt is cancelled."""
    step = {"headers": Step(headers=(("k", "v"),), headers_lead=0.3), "timer": Step(wait=0)}.get(event, Step())
    backends[0].script(UNARY, step)
    monkeypatch.setattr(grpc_retry._method, "CallMachine", _Failing)
    monkeypatch.setattr(_Failing, "failing", (event,))
    config = hedging_config(delay="0.1s" if event == "timer" else "20s")
    with grpc_retry.insecure_channel(target(backends), options=[("grpc.service_config", config)]) as ch:
        error, ended = _blocking_unary(ch, b"x")
        assert ended
        assert isinstance(error, grpc.RpcError)
        assert (error.code(), error.details()) == (grpc.StatusCode.INTERNAL, "grpc_retry internal error")
        (logged,) = [record for record in caplog.records if record.exc_info]  # the bug, once, with its traceback
        assert "a bug in the call machine" in str(logged.exc_info[1])
        if event != "start":
            (first,) = backends[0].wait_ended(UNARY, 1)
            assert first.cancelled or event == "status"  # (its end is what failed: it had ended)
        assert not ch._state.calls and TIMERS.pending() == 0
        monkeypatch.setattr(_Failing, "failing", ())
        assert ch.unary_unary(UNARY)(b"y", timeout=10) == b"y"
    assert [len(b.attempts_of(UNARY)) for b in backends][1:] == [0, 0]  # no hedge went


def test_a_blocking_hedged_call_whose_end_is_lost_ends_internal(backends, caplog, monkeypatch):
    """Attempt 0's end never reaches the driver (its callback suppressed) after its headers committed the call,
    which has no deadline: nothing else would end it. The caller, whose poll of the attempt has seen its end, gets
    INTERNAL at once instead of blocking for ever."""
    if not pure_python():
        pytest.skip("patches the call's method: plain Python only (run by CI's pure-Python pass)")
    monkeypatch.setattr(_Driver, "_headers_first_ended", lambda self, n, attempt: None)
    backends[0].script(UNARY, Step(headers=(("k", "v"),), headers_lead=0.2))
    config = hedging_config(delay="0.1s")
    with grpc_retry.insecure_channel(target(backends), options=[("grpc.service_config", config)]) as ch:
        error, ended = _blocking_unary(ch, b"x")
        assert ended
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.INTERNAL
        assert error.details() == "grpc_retry internal error: the call's end was lost"
        assert "end was lost" in caplog.text
        assert not ch._state.calls and TIMERS.pending() == 0
