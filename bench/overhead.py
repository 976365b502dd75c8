"""Client CPU per call through grpc_retry divided by the same through plain grpcio (C-core's own retries, same
service config), on the happy path, against one server process, in alternating rounds of one run, at several
numbers of calls in flight.

Points, each on both APIs (`aio_*`, `sync_*`; sync runs a thread per call in flight):
- `unary`, `server_stream` (5 messages), `client_stream` (2 messages), `bidi` (2 messages each way, each echoed): a
  retry policy, one address; `unary_future` and `client_stream_future` (sync only): the unary and client-streaming
  calls as `.future().result()`;
- `unary_named`: the unary point through a name (localhost): a name's subchannels are watched more closely
  (a lost connection has the name looked up again), which on the sync API costs a state read per attempt;
- `hedged_unary`: hedgingDelay 1 s, so the first attempt always answers first, against plain grpcio unary with the
  same config (grpcio ignores hedgingPolicy);
- `unary_timed`, `server_stream_timed`: the unary and server-streaming points with `perAttemptRecvTimeout` 1 s in
  the retry policy (every call answers well within it); `vs_untimed` is grpc_retry's CPU per call over the same
  call's without the setting, measured in the same rounds: what each attempt's timer costs a call that never needs
  it;
- `unary_budget`: the unary point with `grpc_retry.retry_budget` set (its rate form, GEP-3388's defaults);
  `vs_unbudgeted` is grpc_retry's CPU per call over the same call's without it, in the same rounds: what the budget
  costs calls that need no retry;
- `unary_aa`: the unary point with grpcio on both sides, two identical channels: how far apart this run measures
  two of the same (an A/A test: its ratio's distance from 1 is the noise floor of the others);
- `unary_300`: round_robin over 300 addresses (127.0.0.1 to 127.0.1.50, one server), against grpcio with the same
  config; `vs_one_address` is its grpc_retry CPU per call over the same call's on one address (round_robin), and
  `plain_vs_one_address` the same for grpcio: what spreading calls over 300 connections costs grpcio itself;
- `unary_300_no_bdp`: the same four channels, with HTTP/2 BDP probing off (`grpc.http2.bdp_probe` 0) on them and on
  a second server: each connection of C-core's transport probes its bandwidth-delay product with pings of its own,
  so 300 connections send and answer more pings per call than one does, through grpcio as through grpc_retry.
  Without them the syscalls per call are the same at 300 addresses as at one, and what is left of
  `vs_one_address` is what 300 addresses cost grpc_retry's picker and subchannels (and the caches);
- `unary_otel` (with opentelemetry-sdk installed): the unary point with an OpenTelemetry SDK meter provider and
  tracer provider on grpc_retry's channel (every call recorded and traced, spans batched to an exporter that drops
  them); the other points have telemetry off, as by default.
- `unary_otel_own`: the unary point with providers that switch grpc_retry's telemetry on and whose objects do
  nothing, at the cost of a C call each (the spans' and histograms' methods are C builtins that take the same
  arguments); `own_share_us` is its CPU per call over the same channel's with telemetry off, whose calls carry a
  trace context header of the same length (its transport is grpcio's cost for any traced call): grpc_retry's own
  share of the cost of telemetry, without the SDK's. `own_share_noop_api_us`: the same with the API's no-op meter
  and a no-op span class of the API's (each of their methods a Python frame of OpenTelemetry's, counted as ours).
- `channel_first_call`: wall time to make a channel and have its first call answered, 1 and 300 addresses,
  grpc_retry's over grpcio's (medians of alternating tries), with grpcio's core already initialized (a channel is
  held open); `close_*_ms`: what the channel's close() then takes, not in the ratio.

`--transport portable` measures grpc_retry on its portable transport (grpcio's public API only), as it runs on a
grpcio whose internals it does not know; `transport` in the output says which one served.

Prints one JSON object as its last line.
Usage: python bench/overhead.py [--calls N] [--rounds R] [--inflight 1,16] [--points aio_unary,sync_unary,...]
                                [--transport direct|portable]
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import itertools
import json
import multiprocessing
import os
import statistics
import threading
import time
from typing import Callable, Dict, List, Tuple

import grpc

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
CLIENT_STREAM = f"/{SERVICE}/ClientStream"
BIDI = f"/{SERVICE}/Bidi"
STREAM_MESSAGES = 5
RETRY_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})
TIMED_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "retryPolicy": {**json.loads(RETRY_CONFIG)["methodConfig"][0]["retryPolicy"], "perAttemptRecvTimeout": "1s"},
}]})
HEDGING_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "1s", "nonFatalStatusCodes": ["UNAVAILABLE"]},
}]})
PAYLOAD = b"x" * 64
BUDGET = ("grpc_retry.retry_budget", "{}")  # the rate form with GEP-3388's defaults
MANY = 300  # addresses of the unary_300 point


def round_robin(config: str) -> str:
    return json.dumps({**json.loads(config), "loadBalancingConfig": [{"round_robin": {}}]})


def many_addresses(port: int, count: int = MANY) -> str:
    """`count` loopback addresses of one server (it listens on all of 127.0.0.0/8)."""
    return "ipv4:" + ",".join(f"127.0.{i // 250}.{i % 250 + 1}:{port}" for i in range(count))


def _serve(port_queue, options=()) -> None:
    async def run():
        server = grpc.aio.server(options=list(options))

        async def unary(request, context):
            return request

        async def stream(request, context):
            for _ in range(STREAM_MESSAGES):
                yield request

        async def one(request, context):  # a unary response in a streaming shape (bench/headers_shape.py)
            yield request

        async def slow(request, context):  # one that its caller cancels first (bench/headers_shape.py)
            await asyncio.sleep(0.05)
            yield request

        async def client_stream(requests, context):
            return b"".join([request async for request in requests])

        async def bidi(requests, context):
            async for request in requests:
                yield request

        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "One": grpc.unary_stream_rpc_method_handler(one),
            "Slow": grpc.unary_stream_rpc_method_handler(slow),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        })])
        port_queue.put(server.add_insecure_port("0.0.0.0:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def start_server(options=()):
    """The server process and its port (reached as 127.0.0.1:port, or any other loopback address)."""
    # A fresh interpreter (spawn), not a fork of this one: nothing of the parent's grpcio state is inherited.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_serve, args=(queue, tuple(options)), daemon=True)
    process.start()
    return process, queue.get(timeout=30)


def summarize(plain: List[float], ours: List[float]) -> dict:
    ratios = [o / p for p, o in zip(plain, ours, strict=True)]
    return {
        "ratio": round(statistics.median(ratios), 3),
        "ratio_of_sums": round(sum(ours) / sum(plain), 3),
        "plain_us": round(statistics.median(plain) * 1e6, 1),
        "grpc_retry_us": round(statistics.median(ours) * 1e6, 1),
    }


def _alternate(runs: Dict[str, Callable[[], None]], calls: int, rounds: int) -> Dict[str, List[float]]:
    """CPU per call of each run, in rounds that alternate their order."""
    for run in runs.values():
        run()  # warm up connections and caches
    samples: Dict[str, List[float]] = {name: [] for name in runs}
    order = list(runs.items())
    for r in range(rounds):
        for name, run in (order if r % 2 == 0 else order[::-1]):
            start = time.process_time()
            run()
            samples[name].append((time.process_time() - start) / calls)
    return samples


def _compare(runs: Dict[str, Callable[[], None]], calls: int, rounds: int) -> dict:
    """runs: "plain", "ours" and maybe "ours_one_address" / "plain_one_address" (then `vs_one_address` /
    `plain_vs_one_address`: ours / plain over it)."""
    samples = _alternate(runs, calls, rounds)
    result = summarize(samples["plain"], samples["ours"])
    if "ours_telemetry_off" in samples:  # grpc_retry's own telemetry work: the same call, telemetry off
        for run, key in (("ours", "own_share_us"), ("ours_noop_api", "own_share_noop_api_us")):
            result[key] = round(statistics.median(
                o - b for o, b in zip(samples[run], samples["ours_telemetry_off"], strict=True)) * 1e6, 1)
    if "ours_untimed" in samples:  # the same calls without perAttemptRecvTimeout
        result["vs_untimed"] = round(statistics.median(
            o / b for o, b in zip(samples["ours"], samples["ours_untimed"], strict=True)), 3)
    if "ours_unbudgeted" in samples:  # the same calls without a retry budget
        result["vs_unbudgeted"] = round(statistics.median(
            o / b for o, b in zip(samples["ours"], samples["ours_unbudgeted"], strict=True)), 3)
    for run in ("ours", "plain"):
        if f"{run}_one_address" in samples:
            result[f"{'' if run == 'ours' else 'plain_'}vs_one_address"] = round(statistics.median(
                o / b for o, b in zip(samples[run], samples[f"{run}_one_address"], strict=True)), 3)
    return result


def otel_options() -> list:
    """Channel options that turn grpc_retry's metrics and spans on with OpenTelemetry's SDK ([] without it)."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return []

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
    return [("grpc_retry.meter_provider", MeterProvider(metric_readers=[InMemoryMetricReader()])),
            ("grpc_retry.tracer_provider", tracer_provider)]


_NOT_RUNS = ("kind", "metadata", "options", "sync_only", "grpcio_only")  # what a point holds beside its runs
NO_BDP = (("grpc.http2.bdp_probe", 0),)  # options of the unary_300_no_bdp point's channels and server


def _spread_runs(one: str, many: str) -> Dict[str, tuple]:
    """A 300-address point's runs: round_robin over `many` addresses, and over `one` to compare with."""
    config = round_robin(RETRY_CONFIG)
    return {"plain": (many, config, []), "ours": (many, config, []), "ours_one_address": (one, config, []),
            "plain_one_address": (one, config, [])}


def _points(port: int, no_bdp_port: int) -> Dict[str, dict]:
    """Each point: its method kind, and the channels (target, config, extra options of ours) of each run;
    `options`: options of all its channels."""
    one, many = f"127.0.0.1:{port}", many_addresses(port)
    quiet_one, quiet_many = f"127.0.0.1:{no_bdp_port}", many_addresses(no_bdp_port)
    named = f"localhost:{port}"
    points = {
        "unary": {"kind": "unary", "plain": (one, RETRY_CONFIG, []), "ours": (one, RETRY_CONFIG, [])},
        "server_stream": {"kind": "stream", "plain": (one, RETRY_CONFIG, []), "ours": (one, RETRY_CONFIG, [])},
        "client_stream": {"kind": "client_stream", "plain": (one, RETRY_CONFIG, []),
                          "ours": (one, RETRY_CONFIG, [])},
        "bidi": {"kind": "bidi", "plain": (one, RETRY_CONFIG, []), "ours": (one, RETRY_CONFIG, [])},
        "client_stream_future": {"kind": "client_stream_future", "sync_only": True, "plain": (one, RETRY_CONFIG, []),
                                 "ours": (one, RETRY_CONFIG, [])},
        "unary_future": {"kind": "unary_future", "sync_only": True, "plain": (one, RETRY_CONFIG, []),
                         "ours": (one, RETRY_CONFIG, [])},
        "hedged_unary": {"kind": "unary", "plain": (one, HEDGING_CONFIG, []), "ours": (one, HEDGING_CONFIG, [])},
        "unary_timed": {"kind": "unary", "plain": (one, RETRY_CONFIG, []), "ours": (one, TIMED_CONFIG, []),
                        "ours_untimed": (one, RETRY_CONFIG, [])},
        "server_stream_timed": {"kind": "stream", "plain": (one, RETRY_CONFIG, []), "ours": (one, TIMED_CONFIG, []),
                                "ours_untimed": (one, RETRY_CONFIG, [])},
        "unary_budget": {"kind": "unary", "plain": (one, RETRY_CONFIG, []), "ours": (one, RETRY_CONFIG, [BUDGET]),
                         "ours_unbudgeted": (one, RETRY_CONFIG, [])},
        # grpcio against itself: what two identical channels measure apart in this run (the noise floor)
        "unary_aa": {"kind": "unary", "grpcio_only": True, "plain": (one, RETRY_CONFIG, []),
                     "ours": (one, RETRY_CONFIG, [])},
        "unary_named": {"kind": "unary", "plain": (named, RETRY_CONFIG, []), "ours": (named, RETRY_CONFIG, [])},
        "unary_300": {"kind": "unary", **_spread_runs(one, many)},
        "unary_300_no_bdp": {"kind": "unary", "options": list(NO_BDP), **_spread_runs(quiet_one, quiet_many)},
    }
    otel = otel_options()
    if otel:
        points["unary_otel"] = {"kind": "unary", "plain": (one, RETRY_CONFIG, []), "ours": (one, RETRY_CONFIG, otel)}
    own = otel_own_options()
    if own:
        # The calls with telemetry off carry a trace context header as long as the one grpc_retry then adds:
        # what that header costs grpcio's transport is every traced call's, not grpc_retry's own.
        points["unary_otel_own"] = {"kind": "unary", "plain": (one, RETRY_CONFIG, []),
                                    "ours": (one, RETRY_CONFIG, own),
                                    "ours_noop_api": (one, RETRY_CONFIG, otel_own_options(noop_api=True)),
                                    "ours_telemetry_off": (one, RETRY_CONFIG, []),
                                    "metadata": {"ours_telemetry_off": TRACE_HEADER}}
    return points


TRACE_HEADER = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)


def otel_own_options(noop_api: bool = False) -> list:
    """Providers that turn grpc_retry's metrics and spans on (they are not OpenTelemetry's no-op ones, which
    turn them off) and whose objects keep nothing: spans that are recorded (sampled: grpc_retry fills them in),
    with a valid context (its trace context goes on the wire). What is left is grpc_retry's own work per call.
    Their methods are C builtins that take the same arguments and return at once (a span method's work, however
    little, is the provider's); with `noop_api`, the API's no-op meter and a span class of the API's, whose
    methods are Python functions ([] without opentelemetry-api)."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return []

    span_context = trace.SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False,
                                     trace.TraceFlags(trace.TraceFlags.SAMPLED))

    class Recorded(trace.NonRecordingSpan):
        def is_recording(self):
            return True

    class Bare(trace.NonRecordingSpan):
        # C callables as class attributes are not descriptors: called as they are, without the span
        end = tuple  # end()
        set_attribute = slice  # set_attribute(key, value)
        set_attributes = len  # set_attributes(attributes)
        add_event = slice  # add_event(name, attributes)
        get_span_context = itertools.repeat(span_context).__next__
        is_recording = itertools.repeat(True).__next__

    bare = Bare(span_context)

    class Histogram:
        record = slice  # record(value, attributes)

    class Meter(metrics.NoOpMeter):
        def create_histogram(self, *args, **kwargs):
            return Histogram()

    class Tracer(trace.NoOpTracer):
        # (the SDK's parameters, named: no tuple and dict made for *args and **kwargs, which the SDK's does not make)
        def start_span(self, name, context=None, kind=None, attributes=None, links=None, start_time=None,
                       record_exception=True, set_status_on_exception=True):
            return Recorded(span_context) if noop_api else bare

    class Meters(metrics.MeterProvider):
        def get_meter(self, name, *args, **kwargs):
            return metrics.NoOpMeter(name) if noop_api else Meter(name)

    class Tracers(trace.TracerProvider):
        def get_tracer(self, *args, **kwargs):
            return Tracer()

    return [("grpc_retry.meter_provider", Meters()), ("grpc_retry.tracer_provider", Tracers())]


# -- asyncio ----------------------------------------------------------------------------------------------------


def _aio_one(channel, kind: str, metadata=None):
    if kind == "bidi":
        bidi = channel.stream_stream(BIDI)

        async def one_bidi():
            async for _ in bidi(iter((PAYLOAD, PAYLOAD))):
                pass
        return one_bidi
    if kind == "client_stream":
        client_stream = channel.stream_unary(CLIENT_STREAM)

        async def one_client_stream():
            return await client_stream(iter((PAYLOAD, PAYLOAD)))
        return one_client_stream
    if kind == "stream":
        stream = channel.unary_stream(STREAM)

        async def one_stream():
            async for _ in stream(PAYLOAD):
                pass
        return one_stream
    unary = channel.unary_unary(UNARY)

    async def one_unary():
        return await unary(PAYLOAD)

    async def one_unary_with_metadata():
        return await unary(PAYLOAD, metadata=metadata)
    return one_unary if metadata is None else one_unary_with_metadata


def _aio_runner(loop: asyncio.AbstractEventLoop, one, calls: int, inflight: int) -> Callable[[], None]:
    async def worker(n: int):
        for _ in range(n):
            await one()

    async def all_workers():
        await asyncio.gather(*(worker(calls // inflight) for _ in range(inflight)))

    return lambda: loop.run_until_complete(all_workers())


def _aio_channel(run: str, common: list, target: str, config: str, extra: list):
    import grpc_retry.aio

    options = [("grpc.service_config", config), *common]
    if run.startswith("plain"):
        return grpc.aio.insecure_channel(target, options=options)
    return grpc_retry.aio.insecure_channel(target, options + extra)


def _aio_points(loop: asyncio.AbstractEventLoop, ports: tuple, calls: int, rounds: int, inflights: List[int],
                wanted) -> dict:
    results = {}
    for name, point in _points(*ports).items():
        if not wanted(f"aio_{name}") or point.get("sync_only"):
            continue
        kinds = {run: "plain" if point.get("grpcio_only") else run for run in point if run not in _NOT_RUNS}
        common = point.get("options", [])
        channels = {run: loop.run_until_complete(_make(
            lambda kind=kind, p=point[run], common=common: _aio_channel(kind, common, *p)))
            for run, kind in kinds.items()}
        metadata = point.get("metadata", {})
        results[f"aio_{name}"] = {str(inflight): _compare(
            {run: _aio_runner(loop, _aio_one(channel, point["kind"], metadata.get(run)), calls, inflight)
             for run, channel in channels.items()}, calls, rounds) for inflight in inflights}
        for channel in channels.values():
            loop.run_until_complete(channel.close())
    return results


async def _make(make):
    return make()


# -- sync -------------------------------------------------------------------------------------------------------


def _sync_one(channel, kind: str, metadata=None):
    if kind == "bidi":
        bidi = channel.stream_stream(BIDI)

        def one_bidi(request):
            for _ in bidi(iter((request, request))):
                pass
        return one_bidi
    if kind == "client_stream":
        client_stream = channel.stream_unary(CLIENT_STREAM)

        def one_client_stream(request):
            return client_stream(iter((request, request)))
        return one_client_stream
    if kind == "unary_future":
        unary_future = channel.unary_unary(UNARY).future

        def one_unary_future(request):
            return unary_future(request).result()
        return one_unary_future
    if kind == "client_stream_future":
        future = channel.stream_unary(CLIENT_STREAM).future

        def one_client_stream_future(request):
            return future(iter((request, request))).result()
        return one_client_stream_future
    if kind == "stream":
        stream = channel.unary_stream(STREAM)

        def one_stream(request):
            for _ in stream(request):
                pass
        return one_stream
    unary = channel.unary_unary(UNARY)
    return unary if metadata is None else lambda request: unary(request, metadata=metadata)


def _sync_runner(method, calls: int, inflight: int) -> Callable[[], None]:
    def worker(n: int):
        for _ in range(n):
            method(PAYLOAD)

    def run():
        if inflight == 1:
            worker(calls)
            return
        threads = [threading.Thread(target=worker, args=(calls // inflight,)) for _ in range(inflight)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return run


def _sync_channel(run: str, common: list, target: str, config: str, extra: list):
    import grpc_retry

    options = [("grpc.service_config", config), *common]
    if run.startswith("plain"):
        return grpc.insecure_channel(target, options=options)
    return grpc_retry.insecure_channel(target, options + extra)


def _sync_points(ports: tuple, calls: int, rounds: int, inflights: List[int], wanted) -> dict:
    results: dict = {}
    for name, point in _points(*ports).items():
        if not wanted(f"sync_{name}"):
            continue
        common = point.get("options", [])
        channels = {run: _sync_channel("plain" if point.get("grpcio_only") else run, common, *point[run])
                    for run in point if run not in _NOT_RUNS}
        metadata = point.get("metadata", {})
        results[f"sync_{name}"] = {str(inflight): _compare(
            {run: _sync_runner(_sync_one(channel, point["kind"], metadata.get(run)), calls, inflight)
             for run, channel in channels.items()}, calls, rounds) for inflight in inflights}
        for channel in channels.values():
            channel.close()
    return results


# -- a new channel ----------------------------------------------------------------------------------------------


def _sync_first_call(make, target: str, options: list) -> Callable[[], Tuple[float, float]]:
    def once():
        start = time.perf_counter()
        channel = make(target, options=options)
        channel.unary_unary(UNARY)(PAYLOAD, timeout=30)
        answered = time.perf_counter()
        channel.close()
        return answered - start, time.perf_counter() - answered
    return once


def _aio_first_call(loop, make, target: str, options: list) -> Callable[[], Tuple[float, float]]:
    async def once():
        start = time.perf_counter()
        channel = make(target, options=options)
        await channel.unary_unary(UNARY)(PAYLOAD, timeout=30)
        answered = time.perf_counter()
        await channel.close()
        return answered - start, time.perf_counter() - answered
    return lambda: loop.run_until_complete(once())


def _first_call(loop: asyncio.AbstractEventLoop, port: int, tries: int) -> dict:
    """Wall time from making a channel to its first call's answer, grpc_retry's over grpcio's (same config); and
    the time its close() then takes."""
    import grpc_retry
    import grpc_retry.aio

    config = round_robin(RETRY_CONFIG)
    results = {}
    # grpcio's core is initialized while a channel of it lives, and torn down when the last one goes: a channel
    # made when none lives pays that (~0.25 ms), whichever channel it is. Which side pays it here would depend on
    # when each side's closed channels are collected (grpcio's own linger in a cycle until a collection, grpc_retry's
    # subchannels go at close); this idle channel keeps the core up for both, as any other channel of the process.
    held = grpc.insecure_channel(f"127.0.0.1:{port}")
    for addresses in (1, MANY):
        target = f"127.0.0.1:{port}" if addresses == 1 else many_addresses(port, addresses)
        options = [("grpc.service_config", config)]
        for api, plain, ours in (
                ("sync", _sync_first_call(grpc.insecure_channel, target, options),
                 _sync_first_call(grpc_retry.insecure_channel, target, options)),
                ("aio", _aio_first_call(loop, grpc.aio.insecure_channel, target, options),
                 _aio_first_call(loop, grpc_retry.aio.insecure_channel, target, options))):
            samples: Dict[str, List[Tuple[float, float]]] = {"plain": [], "ours": []}
            plain(), ours()  # imports and first-use caches
            for r in range(tries):
                for name, once in ((("plain", plain), ("ours", ours)) if r % 2 == 0
                                   else (("ours", ours), ("plain", plain))):
                    samples[name].append(once())
            first = {name: statistics.median(t[0] for t in times) for name, times in samples.items()}
            close = {name: statistics.median(t[1] for t in times) for name, times in samples.items()}
            results[f"{api}_{addresses}"] = {
                "ratio": round(first["ours"] / first["plain"], 3),
                "plain_ms": round(first["plain"] * 1e3, 2),
                "grpc_retry_ms": round(first["ours"] * 1e3, 2),
                "close_plain_ms": round(close["plain"] * 1e3, 2),
                "close_grpc_retry_ms": round(close["ours"] * 1e3, 2)}
    held.close()
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2048, help="calls per round and channel")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds per channel and point")
    parser.add_argument("--inflight", default="1,16,128", help="calls in flight at each point, comma-separated")
    parser.add_argument("--points", default="", help="comma-separated names (aio_unary, sync_hedged_unary, "
                        "channel_first_call, ...): only these; * matches any part of a name ('*_otel_own')")
    parser.add_argument("--transport", choices=("direct", "portable"), default=None,
                        help="the transport grpc_retry uses (default: its own choice)")
    args = parser.parse_args(argv)
    if args.transport is not None:  # read as grpc_retry is first imported (below, and in the server's process)
        os.environ["GRPC_RETRY_TRANSPORT"] = args.transport
    inflights = [int(n) for n in args.inflight.split(",")]
    patterns = [p for p in args.points.split(",") if p]

    def wanted(name: str) -> bool:
        return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)

    process, port = start_server()
    no_bdp_process, no_bdp_port = start_server(NO_BDP)
    # One event loop for the run: grpc.aio before 1.71 cannot move to a second loop once its first is closed.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        result = {"calls_per_round": args.calls, "rounds": args.rounds, "grpcio": grpc.__version__}
        result.update(_aio_points(loop, (port, no_bdp_port), args.calls, args.rounds, inflights, wanted))
        result.update(_sync_points((port, no_bdp_port), args.calls, args.rounds, inflights, wanted))
        if wanted("channel_first_call"):
            result["channel_first_call"] = _first_call(loop, port, max(args.rounds, 4))
        from grpc_retry import _transport

        result["transport"] = _transport.NAME
    finally:
        loop.close()
        process.kill()
        no_bdp_process.kill()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
