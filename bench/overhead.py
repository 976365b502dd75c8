"""Client CPU per call through grpc_retry divided by the same through plain grpcio (C-core's own retries,
same service config), on the happy path, against one server process, in alternating rounds of one run.

Prints one JSON object as its last line. Usage: python bench/overhead.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time

import grpc

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
STREAM_MESSAGES = 5
SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
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

        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
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


def _cpu_per_call(run, calls: int) -> float:
    start = time.process_time()
    run(calls)
    return (time.process_time() - start) / calls


def summarize(plain, ours):
    ratios = [o / p for p, o in zip(plain, ours)]
    return {
        "ratio": round(statistics.median(ratios), 3),
        "ratio_of_sums": round(sum(ours) / sum(plain), 3),
        "plain_us": round(statistics.median(plain) * 1e6, 1),
        "grpc_retry_us": round(statistics.median(ours) * 1e6, 1),
    }


def _one_call(channel, kind: str):
    """A coroutine function making one call of `kind` on `channel`."""
    if kind == "unary":
        unary = channel.unary_unary(UNARY)

        async def one_unary():
            return await unary(PAYLOAD)
        return one_unary
    stream = channel.unary_stream(STREAM)

    async def one_stream():
        async for _ in stream(PAYLOAD):
            pass
    return one_stream


async def _aio_bench(target: str, calls: int, rounds: int):
    import grpc_retry.aio

    plain = grpc.aio.insecure_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)])
    ours = grpc_retry.aio.insecure_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)])
    results = {}
    for kind in ("unary", "stream"):
        plain_one, ours_one = _one_call(plain, kind), _one_call(ours, kind)
        for warm in (plain_one, ours_one):  # warm up connections and caches
            for _ in range(300):
                await warm()
        samples = {"plain": [], "ours": []}
        for r in range(rounds):
            order = (("plain", plain_one), ("ours", ours_one))
            for name, one in (order if r % 2 == 0 else order[::-1]):
                start = time.process_time()
                for _ in range(calls):
                    await one()
                samples[name].append((time.process_time() - start) / calls)
        results[f"aio_{kind}"] = summarize(samples["plain"], samples["ours"])
    await plain.close()
    await ours.close()
    return results


def _sync_bench(target: str, calls: int, rounds: int):
    try:
        import grpc_retry
        ours = grpc_retry.insecure_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)])
    except (ImportError, AttributeError, NotImplementedError):
        return {}
    plain = grpc.insecure_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)])
    plain_m, ours_m = plain.unary_unary(UNARY), ours.unary_unary(UNARY)

    def runner(method):
        def run(n):
            for _ in range(n):
                method(PAYLOAD)
        return run

    plain_run, ours_run = runner(plain_m), runner(ours_m)
    plain_run(300)
    ours_run(300)
    samples = {"plain": [], "ours": []}
    for r in range(rounds):
        order = (("plain", plain_run), ("ours", ours_run))
        for name, run in (order if r % 2 == 0 else order[::-1]):
            samples[name].append(_cpu_per_call(run, calls))
    plain.close()
    ours.close()
    return {"sync_unary": summarize(samples["plain"], samples["ours"])}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds per channel")
    args = parser.parse_args(argv)
    process, target = start_server()
    try:
        result = {"calls_per_round": args.calls, "rounds": args.rounds, "grpcio": grpc.__version__}
        result.update(asyncio.run(_aio_bench(target, args.calls, args.rounds)))
        result.update(_sync_bench(target, args.calls, args.rounds))
    finally:
        process.kill()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
