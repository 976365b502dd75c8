"""What the retries did, seen from outside: statistics, OpenTelemetry metrics and spans, the trace log — for known
sequences of calls on real backends, every counter, bucket and point asserted exactly.

The retry sequence is grpc-go's TestRetryUnary: one backend answers the n-th attempt it sees with OK (0, 2, 5),
INTERNAL (6, 8, 11: not retryable) or ALREADY_EXISTS (every other: retryable), under maxAttempts 4."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

import grpc
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, Step, fail
from support.clients import ECHO_SERVICE, retry_policy, service_config

import grpc_retry
import grpc_retry.aio
from grpc_retry._telemetry import COUNT_BUCKETS, LATENCY_BUCKETS

OK = grpc.StatusCode.OK
AE = grpc.StatusCode.ALREADY_EXISTS
INTERNAL = grpc.StatusCode.INTERNAL
METHOD = UNARY.lstrip("/")


def go_retry_config() -> str:
    policy = {"maxAttempts": 4, "initialBackoff": ".01s", "maxBackoff": ".01s", "backoffMultiplier": 1.0,
              "retryableStatusCodes": ["ALREADY_EXISTS"]}
    return json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "waitForReady": True,
                                         "retryPolicy": policy}]})


def go_sequence(backend: Backend) -> None:
    steps = []
    for i in range(16):
        if i in (0, 2, 5):
            steps.append(Step())
        elif i in (6, 8, 11):
            steps.append(fail(INTERNAL, "non-retryable error"))
        else:
            steps.append(fail(AE, "retryable error"))
    backend.script(UNARY, *steps)


# (status the application gets, attempts the backend saw in total after the call): grpc-go's expectations
GO_CALLS = [(OK, 1), (OK, 3), (OK, 6), (INTERNAL, 7), (INTERNAL, 9), (INTERNAL, 12), (AE, 16)]


# A program of its own sets OpenTelemetry's global providers (once per process), reading into `reader` and `exporter`.
GLOBAL_PROVIDERS = (
    "from opentelemetry import metrics, trace\n"
    "from opentelemetry.sdk.metrics import MeterProvider\n"
    "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
    "from opentelemetry.sdk.trace import TracerProvider\n"
    "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
    "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
    "reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()\n"
    "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
    "tp = TracerProvider(); tp.add_span_processor(SimpleSpanProcessor(exporter)); trace.set_tracer_provider(tp)\n"
)


def telemetry() -> tuple[Any, InMemoryMetricReader, InMemorySpanExporter, List[tuple[str, Any]]]:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    options = [("grpc_retry.meter_provider", MeterProvider(metric_readers=[reader])),
               ("grpc_retry.tracer_provider", tracer_provider)]
    return tracer_provider, reader, exporter, options


def points(reader: InMemoryMetricReader) -> Dict[str, List[Any]]:
    out: Dict[str, List[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_go_retry_unary_sequence_counts_statistics_metrics_and_spans(backend: Backend) -> None:
    go_sequence(backend)
    _, reader, exporter, extra = telemetry()
    with grpc_retry.insecure_channel(backend.target, options=[("grpc.service_config", go_retry_config()),
                                                              *extra]) as channel:
        method = channel.unary_unary(UNARY)
        for code, seen in GO_CALLS:
            try:
                method(b"x", timeout=10)
                got = OK
            except grpc.RpcError as error:
                got = error.code()
            assert (got, len(backend.attempts_of(UNARY))) == (code, seen)
        stats = channel.retry_stats()[UNARY]

    assert stats == grpc_retry.MethodStats(
        calls=7, attempts=16, retries=9, hedges=0, retry_attempts_failed=7, transparent_retries=0,
        committed_by_overflow=0, stopped_by_throttling=0, stopped_by_pushback=0, stopped_by_attempt_limit=1,
        histogram=stats.histogram)
    assert dict(stats.histogram) == {">=1": 5, ">=2": 3, ">=3": 1, ">=4": 0, ">=5": 0, ">=10": 0, ">=100": 0,
                                     ">=1000": 0}

    by_name = points(reader)
    labels = {"grpc.method": METHOD, "grpc.target": f"dns:///{backend.target}"}
    (retries,) = by_name["grpc.client.call.retries"]  # recorded for the five calls that retried, never a 0
    assert dict(retries.attributes) == labels
    assert (retries.count, retries.sum) == (5, 9)
    assert list(retries.explicit_bounds) == list(COUNT_BUCKETS)
    assert list(retries.bucket_counts) == [2, 2, 1, 0, 0, 0]  # 1, 1 | 2, 2 | 3
    assert "grpc.client.call.hedges" not in by_name and "grpc.client.call.transparent_retries" not in by_name
    (delay,) = by_name["grpc.client.call.retry_delay"]
    assert delay.count == 7 and 0 < delay.sum < 2 and list(delay.explicit_bounds) == list(LATENCY_BUCKETS)
    durations = {dict(p.attributes)["grpc.status"]: p.count for p in by_name["grpc.client.call.duration"]}
    assert durations == {"OK": 3, "INTERNAL": 3, "ALREADY_EXISTS": 1}
    for p in by_name["grpc.client.call.duration"]:
        assert {k: v for k, v in dict(p.attributes).items() if k != "grpc.status"} == labels

    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name == METHOD]
    attempts = [s for s in spans if s.name.startswith("attempt ")]
    assert len(calls) == 7 and len(attempts) == 16
    assert [s.attributes["grpc_retry.attempts"] for s in calls] == [1, 2, 3, 1, 2, 3, 4]
    assert [s.attributes["grpc_retry.reason"] for s in calls] == [
        "ok", "ok", "ok", "fatal_status", "fatal_status", "fatal_status", "attempts_exhausted"]
    for call in calls:
        children = [a for a in attempts if a.parent is not None and a.parent.span_id == call.context.span_id]
        assert len(children) == call.attributes["grpc_retry.attempts"]
        assert all(a.context.trace_id == call.context.trace_id for a in children)
    last = calls[-1]
    assert last.attributes["rpc.grpc.status_code"] == AE.value[0] and not last.status.is_ok
    assert [e.name for e in last.events] == [
        "attempt ended", "retry scheduled", "retry", "attempt ended", "retry scheduled", "retry", "attempt ended",
        "retry scheduled", "retry", "attempt ended"]


async def test_hedged_sequence_counts_hedges(backends: List[Backend]) -> None:
    """Call 1: backends 0 and 1 hold, backend 2 answers: two hedges. Call 2: backend 0 answers at once."""
    for b in backends[:2]:
        b.script(UNARY, Step(wait=0))
    _, reader, exporter, extra = telemetry()
    policy = {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}
    config = json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "hedgingPolicy": policy}]})
    target = "ipv4:" + ",".join(b.target for b in backends)
    async with grpc_retry.aio.insecure_channel(target, options=[("grpc.service_config", config), *extra]) as ch:
        assert await ch.unary_unary(UNARY)(b"x", timeout=10) == b"x"
        backends[0].script(UNARY, Step())
        assert await ch.unary_unary(UNARY)(b"y", timeout=10) == b"y"
        stats = ch.retry_stats()[UNARY]
    assert (stats.calls, stats.attempts, stats.hedges, stats.retries) == (2, 4, 2, 0)
    by_name = points(reader)
    (hedges,) = by_name["grpc.client.call.hedges"]
    assert (hedges.count, hedges.sum, list(hedges.bucket_counts)) == (1, 2, [0, 1, 0, 0, 0, 0])
    assert "grpc.client.call.retries" not in by_name
    assert sum(p.count for p in by_name["grpc.client.call.duration"]) == 2
    calls = [s for s in exporter.get_finished_spans() if s.name == METHOD]
    assert [s.attributes["grpc_retry.hedges"] for s in calls] == [2, 0]
    names = [e.name for e in calls[0].events]
    assert names.count("hedge") == 2 and "committed" in names
    attempts = [s for s in exporter.get_finished_spans() if s.name.startswith("attempt ")]
    assert sorted(s.attributes["grpc_retry.attempt_type"] for s in attempts) == [
        "hedge", "hedge", "original", "original"]
    losers = [s for s in attempts if s.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]]
    assert len(losers) == 2
    # Attributes are shared by calls alike (made once): each call's still say its own attempts and backends
    committed = [dict(e.attributes) for s in calls for e in s.events if e.name == "committed"]
    assert committed == [{"attempt": 3, "cause": "answered"}, {"attempt": 1, "cause": "answered"}]
    assert [dict(e.attributes) for s in calls for e in s.events if e.name == "attempt ended"] == [
        {"attempt": 3, "grpc.status": "OK"}, {"attempt": 1, "grpc.status": "OK"}]
    first = {s.attributes["grpc_retry.attempt"]: s.attributes["server.address"] for s in attempts
             if s.parent is not None and s.parent.span_id == calls[0].context.span_id}
    assert sorted(first) == [1, 2, 3] and sorted(first.values()) == sorted(b.target for b in backends)
    (second,) = [s for s in attempts if s.parent is not None and s.parent.span_id == calls[1].context.span_id]
    assert (second.attributes["grpc_retry.attempt"], second.attributes["server.address"]) == (1, backends[0].target)


def test_trace_log_says_what_was_decided_and_why(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    backend.script(UNARY, fail(AE, "retryable error"), fail(AE, "retryable error"), Step())
    caplog.set_level(logging.DEBUG, logger="grpc_retry")
    with grpc_retry.insecure_channel(backend.target, options=[("grpc.service_config", go_retry_config())]) as ch:
        ch.unary_unary(UNARY)(b"x", timeout=10)
        ch.unary_unary(UNARY)(b"x", timeout=10)
    lines = [r.getMessage() for r in caplog.records if r.name == "grpc_retry"]
    first = int(lines[0].split()[1])
    where = backend.target
    assert lines[:8] == [
        f"call {first} {UNARY} attempt 1 on {where}",
        f"call {first} {UNARY} attempt 1 on {where}: ALREADY_EXISTS → retry in {_ms(lines[1])} ms (2 of 4)",
        f"call {first} {UNARY} → retry 2 on {where}",
        f"call {first} {UNARY} attempt 2 on {where}: ALREADY_EXISTS → retry in {_ms(lines[3])} ms (3 of 4)",
        f"call {first} {UNARY} → retry 3 on {where}",
        f"call {first} {UNARY} attempt 3 on {where}: OK",
        lines[6],
        f"call {first + 1} {UNARY} attempt 1 on {where}",
    ]
    assert lines[6].startswith(f"call {first} {UNARY} ended OK: ok after 3 attempts (")
    assert 0 <= int(_ms(lines[1])) <= 10


def _ms(line: str) -> str:
    return line.split("retry in ")[1].split(" ms")[0]


def test_trace_log_names_throttling_and_pushback(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    policy = {"maxAttempts": 4, "initialBackoff": ".01s", "maxBackoff": ".01s", "backoffMultiplier": 1.0,
              "retryableStatusCodes": ["UNAVAILABLE"]}
    config = json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "retryPolicy": policy}],
                         "retryThrottling": {"maxTokens": 2, "tokenRatio": 0.1}})
    caplog.set_level(logging.DEBUG, logger="grpc_retry")
    backend.script(UNARY, *[fail()] * 8)
    # A throttle of its own: the channel's target is unique to this backend's port.
    with grpc_retry.insecure_channel(backend.target, options=[("grpc.service_config", config)]) as ch:
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                ch.unary_unary(UNARY)(b"x", timeout=10)
        stats = ch.retry_stats()[UNARY]
        throttle = ch.throttle
    assert throttle is not None and (throttle.max_tokens, throttle.threshold, throttle.token_ratio) == (2, 1, 0.1)
    # Each call's first failure takes a token (2 -> 1 -> 0), leaving no more than the threshold: no retry.
    assert throttle.tokens == 0 and not throttle.retrying
    assert (stats.calls, stats.attempts, stats.stopped_by_throttling) == (2, 2, 2)
    stops = [r.getMessage() for r in caplog.records if "stop: throttled" in r.getMessage()]
    assert [line.split(": ", 1)[1] for line in stops] == [
        "UNAVAILABLE → stop: throttled (tokens 1.0 ≤ 1)", "UNAVAILABLE → stop: throttled (tokens 0.0 ≤ 1)"]


def test_trace_log_names_a_retry_the_budget_refused(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    policy = {"maxAttempts": 4, "initialBackoff": ".01s", "maxBackoff": ".01s", "backoffMultiplier": 1.0,
              "retryableStatusCodes": ["UNAVAILABLE"]}
    config = json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "retryPolicy": policy}]})
    budget = json.dumps({"budget": {"percent": 0}, "minRetryRate": {"count": 1, "interval": "60s"}})
    caplog.set_level(logging.DEBUG, logger="grpc_retry")
    backend.script(UNARY, *[fail()] * 3)
    with grpc_retry.insecure_channel(backend.target, options=[("grpc.service_config", config),
                                                              ("grpc_retry.retry_budget", budget)]) as ch:
        with pytest.raises(grpc.RpcError):
            ch.unary_unary(UNARY)(b"x", timeout=10)
        stats = ch.retry_stats()[UNARY]
    assert (stats.calls, stats.attempts, stats.refused_by_budget) == (1, 2, 1)
    assert "calls whose retry or hedge the retry budget refused 1" in str(stats)
    refused = [r.getMessage() for r in caplog.records if "not sent: budget" in r.getMessage()]
    assert [line.split(": ", 1)[1] for line in refused] == ["UNAVAILABLE → retry not sent: budget"]


def test_timed_out_attempts_and_server_delays_are_logged_counted_and_traced(
        backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    from test_attempt_timeouts import STALL, retry_info

    policy = {**retry_policy(max_attempts=3), "perAttemptRecvTimeout": "0.1s"}
    backend.script(UNARY, STALL, retry_info(0.05))
    caplog.set_level(logging.DEBUG, logger="grpc_retry")
    _, reader, exporter, options = telemetry()
    with grpc_retry.insecure_channel(backend.target, options=[("grpc.service_config", service_config(policy)),
                                                              *options]) as ch:
        ch.unary_unary(UNARY)(b"x", timeout=10)
    lines = [r.getMessage() for r in caplog.records if r.name == "grpc_retry"]
    timed_out = [line for line in lines if "perAttemptRecvTimeout" in line]
    assert timed_out == [f"call {lines[0].split()[1]} {UNARY} attempt 1 on {backend.target}: no answer within "
                         f"perAttemptRecvTimeout, cancelled → retry in {_ms(timed_out[0])} ms (2 of 3)"], lines
    assert any(line.endswith(": UNAVAILABLE → server asks to wait 50 ms (RetryInfo)") for line in lines), lines
    found = points(reader)
    assert [p.value for p in found["grpc_retry.client.attempt.recv_timeouts"]] == [1]
    assert [p.value for p in found["grpc_retry.client.call.server_delays"]] == [1]
    (call,) = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert {"attempt timed out", "server delay"} <= {e.name for e in call.events}


def test_grpc_retry_trace_turns_the_log_on_without_code(backend: Backend, tmp_path: Any) -> None:
    backend.script(UNARY, fail(AE, "retryable error"))
    script = (
        "import sys, grpc_retry\n"
        f"config = {go_retry_config()!r}\n"
        f"ch = grpc_retry.insecure_channel({backend.target!r}, options=[('grpc.service_config', config)])\n"
        f"ch.unary_unary({UNARY!r})(b'x', timeout=10)\n"
        "ch.close()\n"
    )
    env = {**os.environ, "GRPC_RETRY_TRACE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                          cwd=tmp_path)  # not the source tree, whose grpc_retry has no compiled core
    assert done.returncode == 0, done.stderr
    trace = [line for line in done.stderr.splitlines() if " grpc_retry call " in line]
    assert len(trace) == 5, done.stderr
    assert "ALREADY_EXISTS → retry in" in trace[1] and trace[-1].split(" grpc_retry ")[1].startswith("call 1 ")
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "GRPC_RETRY_TRACE"})
    assert quiet.returncode == 0 and " grpc_retry call " not in quiet.stderr


def test_nothing_is_observed_when_nothing_is_on(backend: Backend) -> None:
    """No provider, no DEBUG: calls take no notes (the machine spends one test per decision on it)."""
    with grpc_retry.insecure_channel(backend.target) as ch:
        assert ch._state.telemetry.metrics is None and ch._state.telemetry.tracer is None
        method = ch.unary_unary(UNARY)
        assert method.observe(method._machine(None, None, True, None)) is None


def test_a_provider_option_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="grpc_retry.meter_provider: must be an OpenTelemetry provider"):
        grpc_retry.insecure_channel("localhost:1", options=[("grpc_retry.meter_provider", object())])


async def test_aio_throttle_is_shared_by_the_channels_of_a_target(backend: Backend) -> None:
    config = json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "retryPolicy": {
        "maxAttempts": 2, "initialBackoff": ".01s", "maxBackoff": ".01s", "backoffMultiplier": 1,
        "retryableStatusCodes": ["UNAVAILABLE"]}}], "retryThrottling": {"maxTokens": 10, "tokenRatio": 1}})
    backend.script(UNARY, fail(), fail())
    async with grpc_retry.aio.insecure_channel(backend.target, options=[("grpc.service_config", config)]) as a, \
            grpc_retry.aio.insecure_channel(backend.target, options=[("grpc.service_config", config)]) as b:
        with pytest.raises(grpc.aio.AioRpcError):
            await a.unary_unary(UNARY)(b"x", timeout=10)
        assert a.throttle == b.throttle and a.throttle is not None and a.throttle.tokens == 8
    await asyncio.sleep(0)


@pytest.mark.parametrize("kind", ["server_stream", "client_stream", "bidi"])
def test_every_call_shape_is_observed_on_both_apis(client: Any, backend: Backend, kind: str) -> None:
    """A streaming call that fails once before its first response, then succeeds: one retry, one call."""
    method = {"server_stream": SERVER_STREAM, "client_stream": CLIENT_STREAM, "bidi": BIDI}[kind]
    backend.script(method, fail(AE, "retryable error"), Step())
    _, reader, exporter, extra = telemetry()
    ch = client.channel(backend.target, [("grpc.service_config", go_retry_config()), *extra])
    out = ch.server_stream(method, b"x") if kind == "server_stream" else getattr(ch, kind)(method, [b"a", b"b"])
    assert out.code == OK
    by_name = points(reader)
    (retries,) = by_name["grpc.client.call.retries"]
    assert (retries.count, retries.sum) == (1, 1)
    (duration,) = by_name["grpc.client.call.duration"]
    assert duration.count == 1 and dict(duration.attributes)["grpc.status"] == "OK"
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["attempt 1", "attempt 2", method.lstrip("/")]


def test_a_global_provider_set_before_the_channel_is_used(backend: Backend, tmp_path: Any) -> None:
    """In a process of its own: OpenTelemetry's global providers can be set once per process."""
    backend.script(UNARY, fail(AE, "retryable error"))
    script = (
        GLOBAL_PROVIDERS +
        "import grpc_retry\n"
        f"config = {go_retry_config()!r}\n"
        f"with grpc_retry.insecure_channel({backend.target!r}, options=[('grpc.service_config', config)]) as ch:\n"
        f"    ch.unary_unary({UNARY!r})(b'x', timeout=10)\n"
        "names = sorted(m.name for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics\n"
        "               for m in s.metrics)\n"
        "import json; print(json.dumps([names, sorted(s.name for s in exporter.get_finished_spans())]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["grpc.client.call.duration", "grpc.client.call.retries", "grpc.client.call.retry_delay"],
        ["attempt 1", "attempt 2", METHOD]]


def test_adaptive_hedging_is_observed_as_metrics(backend: Backend) -> None:
    # A budget of one hedge (max_extra_load 0.001: the bucket holds 1 token and refills by 0.001 a call): the first
    # call's hedge is sent, the second call's is not. Both calls' attempts answer after 0.3 s, past the delay.
    backend.script(UNARY, *[Step(wait=0.3)] * 4)
    config = json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "hedgingPolicy": {
        "maxAttempts": 2, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]})
    _, reader, _, extra = telemetry()
    options = [("grpc.service_config", config), ("grpc_retry.max_extra_load", 0.001), *extra]
    with grpc_retry.insecure_channel(backend.target, options=options) as channel:
        method = channel.unary_unary(UNARY)
        assert method(b"a", timeout=10) == b"a" and method(b"b", timeout=10) == b"b"
        stats = channel.retry_stats()[UNARY]
        assert (stats.hedges, stats.hedges_not_sent_for_budget) == (1, 1)
        got = points(reader)
        labels = {"grpc.method": METHOD, "grpc.target": f"dns:///{backend.target}"}
        (delay,) = got["grpc_retry.client.hedging_delay"]
        assert dict(delay.attributes) == labels and delay.value == pytest.approx(0.05)
        (stopped,) = got["grpc_retry.client.hedges_not_sent_for_budget"]
        assert dict(stopped.attributes) == labels and stopped.value == 1
    assert "grpc_retry.client.hedging_delay" not in points(reader)  # a closed channel is no longer observed


def test_calls_the_retry_budget_refused_are_counted_as_a_metric(backend: Backend) -> None:
    backend.script(UNARY, *[fail()] * 4)
    budget = json.dumps({"budget": {"percent": 0}, "minRetryRate": {"count": 1, "interval": "60s"}})
    _, reader, _, extra = telemetry()
    options = [("grpc.service_config", service_config(retry_policy(max_attempts=3))),
               ("grpc_retry.retry_budget", budget), *extra]
    with grpc_retry.insecure_channel(backend.target, options=options) as channel:
        for _ in range(2):  # the first call's one retry goes, the second's does not; each ends refused
            with pytest.raises(grpc.RpcError):
                channel.unary_unary(UNARY)(b"x", timeout=10)
        (refused,) = points(reader)["grpc_retry.client.call.retries_refused_by_budget"]
        assert dict(refused.attributes) == {"grpc.method": METHOD, "grpc.target": f"dns:///{backend.target}"}
        assert refused.value == 2 == channel.retry_stats()[UNARY].refused_by_budget
    assert "grpc_retry.client.call.retries_refused_by_budget" not in points(reader)


@pytest.mark.parametrize("api", ["sync", "aio"])
def test_each_attempt_carries_its_own_span_as_traceparent(backend: Backend, api: str) -> None:
    """The trace context on the wire is the attempt's span, so a server span hangs under the attempt that
    reached it; a traceparent the application (or an instrumentation above) set is replaced by it."""
    backend.script(UNARY, fail(), Step())
    _, _, exporter, extra = telemetry()
    options = [("grpc.service_config", service_config(retry_policy(max_attempts=3))), *extra]
    theirs = (("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),)
    if api == "sync":
        with grpc_retry.insecure_channel(backend.target, options=options) as channel:
            channel.unary_unary(UNARY)(b"x", timeout=10, metadata=theirs)
    else:
        async def call() -> None:
            async with grpc_retry.aio.insecure_channel(backend.target, options=options) as channel:
                await channel.unary_unary(UNARY)(b"x", timeout=10, metadata=theirs)
        asyncio.run(call())
    attempts = sorted((s for s in exporter.get_finished_spans() if s.name.startswith("attempt ")),
                      key=lambda s: s.start_time)
    wire = [a.metadata.get("traceparent") for a in backend.attempts_of(UNARY)]
    assert len(attempts) == len(wire) == 2
    for span, traceparent in zip(attempts, wire, strict=True):
        assert traceparent.split("-")[1:3] == [f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"]


def test_grpc_retry_otel_switches_spans_and_metrics_off_for_the_process(backend: Backend) -> None:
    """GRPC_RETRY_OTEL=none: with a global meter and tracer provider set, grpc_retry exports nothing (and sends no
    traceparent of its own); =metrics keeps the metrics only."""
    code = (
        "import grpc_retry\n" +
        GLOBAL_PROVIDERS +
        f"with grpc_retry.insecure_channel('{backend.target}') as channel:\n"
        f"    channel.unary_unary('{UNARY}')(b'x', timeout=10)\n"
        "data = reader.get_metrics_data()\n"
        "names = [m.name for r in (data.resource_metrics if data else ())\n"
        "         for s in r.scope_metrics for m in s.metrics]\n"
        "print(len(exporter.get_finished_spans()), 'grpc.client.call.duration' in names)\n"
    )
    seen = {}
    for value in ("none", "metrics", "all"):
        env = {**os.environ, "GRPC_RETRY_OTEL": value}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                              cwd=tempfile.gettempdir())
        assert done.returncode == 0, done.stderr[-2000:]
        seen[value] = done.stdout.split()
    assert seen == {"none": ["0", "False"], "metrics": ["0", "True"], "all": ["2", "True"]}
    traceparents = [a.metadata.get("traceparent") for a in backend.attempts_of(UNARY)]
    assert traceparents[0] is None and traceparents[1] is None and traceparents[2] is not None
