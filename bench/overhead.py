"""Client CPU per call through grpc_retry divided by the same through plain grpcio (C-core's own retries, same
service config), on the happy path, against one server process, in alternating rounds of one run, at several
numbers of calls in flight.

Points: aio unary, aio server-streaming (5 messages), sync unary (a thread per call in flight), each with a retry
policy; and a hedged unary call (hedgingDelay 1 s, so the first attempt always answers first) against plain
grpcio unary with the same config (grpcio ignores hedgingPolicy). With opentelemetry-sdk installed, the unary
points again with an OpenTelemetry SDK meter provider and tracer provider on grpc_retry's channel
(`*_otel`: every call recorded and traced, spans batched to an exporter that drops them); the other points have
telemetry off, as by default.

Prints one JSON object as its last line. Usage: python bench/overhead.py [--calls N] [--rounds R] [--inflight 1,16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import threading
import time
from typing import Callable, Dict, List

import grpc

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
STREAM_MESSAGES = 5
RETRY_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})
HEDGING_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "1s", "nonFatalStatusCodes": ["UNAVAILABLE"]},
}]})
PAYLOAD = b"x" * 64


def _serve(port_queue) -> None:
    async def run():
        server = grpc.aio.server()

        async def unary(request, context):
            return request

        async def stream(request, context):
            for _ in range(STREAM_MESSAGES):
                yield request

        async def one(request, context):  # a unary response in a streaming shape (bench/headers_shape.py)
            yield request

        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "One": grpc.unary_stream_rpc_method_handler(one),
        })])
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def start_server():
    queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=_serve, args=(queue,), daemon=True)
    process.start()
    return process, f"127.0.0.1:{queue.get(timeout=30)}"


def summarize(plain: List[float], ours: List[float]) -> dict:
    ratios = [o / p for p, o in zip(plain, ours, strict=True)]
    return {
        "ratio": round(statistics.median(ratios), 3),
        "ratio_of_sums": round(sum(ours) / sum(plain), 3),
        "plain_us": round(statistics.median(plain) * 1e6, 1),
        "grpc_retry_us": round(statistics.median(ours) * 1e6, 1),
    }


def _alternate(plain: Callable[[], None], ours: Callable[[], None], calls: int, rounds: int) -> dict:
    """CPU per call of each, in rounds that alternate which goes first."""
    plain(), ours()  # warm up connections and caches
    samples: Dict[str, List[float]] = {"plain": [], "ours": []}
    for r in range(rounds):
        order = (("plain", plain), ("ours", ours))
        for name, run in (order if r % 2 == 0 else order[::-1]):
            start = time.process_time()
            run()
            samples[name].append((time.process_time() - start) / calls)
    return summarize(samples["plain"], samples["ours"])


# -- asyncio ----------------------------------------------------------------------------------------------------


def _aio_one(channel, kind: str):
    if kind == "stream":
        stream = channel.unary_stream(STREAM)

        async def one_stream():
            async for _ in stream(PAYLOAD):
                pass
        return one_stream
    unary = channel.unary_unary(UNARY)

    async def one_unary():
        return await unary(PAYLOAD)
    return one_unary


def _aio_runner(loop: asyncio.AbstractEventLoop, one, calls: int, inflight: int) -> Callable[[], None]:
    async def worker(n: int):
        for _ in range(n):
            await one()

    async def all_workers():
        await asyncio.gather(*(worker(calls // inflight) for _ in range(inflight)))

    return lambda: loop.run_until_complete(all_workers())


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


def _aio_points(target: str, calls: int, rounds: int, inflights: List[int]) -> dict:
    import grpc_retry.aio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    results = {}

    async def channels(config: str, extra: list = ()):
        options = [("grpc.service_config", config)]
        return (grpc.aio.insecure_channel(target, options=options),
                grpc_retry.aio.insecure_channel(target, options + list(extra)))

    retry_plain, retry_ours = loop.run_until_complete(channels(RETRY_CONFIG))
    hedge_plain, hedge_ours = loop.run_until_complete(channels(HEDGING_CONFIG))
    points = [("aio_unary", retry_plain, retry_ours, "unary"),
              ("aio_server_stream", retry_plain, retry_ours, "stream"),
              ("aio_hedged_unary", hedge_plain, hedge_ours, "unary")]
    otel = otel_options()
    if otel:
        points.append(("aio_unary_otel", retry_plain, loop.run_until_complete(channels(RETRY_CONFIG, otel))[1],
                       "unary"))
    for name, plain, ours, kind in points:
        results[name] = {}
        for inflight in inflights:
            results[name][str(inflight)] = _alternate(
                _aio_runner(loop, _aio_one(plain, kind), calls, inflight),
                _aio_runner(loop, _aio_one(ours, kind), calls, inflight), calls, rounds)
    for channel in {id(c): c for point in points for c in point[1:3]}.values():
        loop.run_until_complete(channel.close())
    loop.close()
    return results


# -- sync -------------------------------------------------------------------------------------------------------


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


def _sync_points(target: str, calls: int, rounds: int, inflights: List[int]) -> dict:
    import grpc_retry

    options = [("grpc.service_config", RETRY_CONFIG)]
    plain = grpc.insecure_channel(target, options=options)
    points = {"sync_unary": grpc_retry.insecure_channel(target, options=options)}
    otel = otel_options()
    if otel:
        points["sync_unary_otel"] = grpc_retry.insecure_channel(target, options=options + otel)
    results: dict = {}
    for name, ours in points.items():
        results[name] = {}
        for inflight in inflights:
            results[name][str(inflight)] = _alternate(
                _sync_runner(plain.unary_unary(UNARY), calls, inflight),
                _sync_runner(ours.unary_unary(UNARY), calls, inflight), calls, rounds)
        ours.close()
    plain.close()
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2048, help="calls per round and channel")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds per channel and point")
    parser.add_argument("--inflight", default="1,16,128", help="calls in flight at each point, comma-separated")
    args = parser.parse_args(argv)
    inflights = [int(n) for n in args.inflight.split(",")]
    process, target = start_server()
    try:
        result = {"calls_per_round": args.calls, "rounds": args.rounds, "grpcio": grpc.__version__}
        result.update(_aio_points(target, args.calls, args.rounds, inflights))
        result.update(_sync_points(target, args.calls, args.rounds, inflights))
    finally:
        process.kill()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
