"""Tail latency with and without hedging: 2,000 unary calls against three backends that answer in ~1 ms but
take 100 ms in 5% of calls (each attempt draws on its own).

Configurations, in one run against the same backends: no policy through plain grpc.aio (round_robin over
the same three addresses); no policy, a hedging policy whose hedgingDelay is the healthy p95 of the plain run,
and a retry policy, all through grpc_retry.aio; and the hedging policy through the sync grpc_retry channel.
Attempts per call are counted by the servers.

Prints one JSON object as its last line. Usage: python bench/hedging.py [--calls N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import time

import grpc

SERVICE = "bench.Tail"
CALL = f"/{SERVICE}/Call"
COUNT = f"/{SERVICE}/Count"
SLOW_SHARE, SLOW_S, FAST_S = 0.05, 0.100, 0.001


def _serve(port_queue) -> None:
    async def run():
        servers, attempts = [], [0]

        async def call(request, context):
            attempts[0] += 1
            await asyncio.sleep(SLOW_S if random.random() < SLOW_SHARE else FAST_S)
            return request

        async def count(request, context):
            n, attempts[0] = attempts[0], 0
            return str(n).encode()

        for _ in range(3):
            server = grpc.aio.server()
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
                "Call": grpc.unary_unary_rpc_method_handler(call),
                "Count": grpc.unary_unary_rpc_method_handler(count),
            })])
            port_queue.put(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            servers.append(server)
        await asyncio.gather(*(s.wait_for_termination() for s in servers))

    asyncio.run(run())


def start_backends():
    queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=_serve, args=(queue,), daemon=True)
    process.start()
    ports = [queue.get(timeout=30) for _ in range(3)]
    return process, "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)


def config(policy: dict | None) -> str:
    method = {"name": [{"service": SERVICE, "method": "Call"}]}
    method.update(policy or {})
    return json.dumps({"methodConfig": [method], "loadBalancingConfig": [{"round_robin": {}}]})


async def attempts_seen(target: str) -> int:
    """Attempts the backends received since the last look (the Count call itself is not counted)."""
    async with grpc.aio.insecure_channel(target.split(",")[0].replace("ipv4:", "")) as channel:
        return int(await channel.unary_unary(COUNT)(b""))


def summarize(latencies, attempts: int, calls: int):
    latencies = sorted(latencies)

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000, 2)

    stats = {"p50_ms": pct(50), "p99_ms": pct(99), "p99.9_ms": pct(99.9),
             "attempts_per_call": round(attempts / calls, 3)}
    return stats, [x * 1000 for x in latencies]


async def measure(channel, target: str, calls: int, concurrency: int):
    multicallable = channel.unary_unary(CALL)
    for _ in range(100):  # warm up every connection
        await multicallable(b"w", timeout=5)
    await attempts_seen(target)
    latencies = []
    queue = list(range(calls))

    async def worker():
        while queue:
            queue.pop()
            start = time.perf_counter()
            await multicallable(b"x", timeout=5)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summarize(latencies, await attempts_seen(target), calls)


async def measure_sync(channel, target: str, calls: int, concurrency: int):
    """The same through a sync channel: `concurrency` threads making blocking calls."""
    multicallable = channel.unary_unary(CALL)
    latencies = []
    queue = list(range(calls))

    def worker():
        while True:
            try:
                queue.pop()
            except IndexError:
                return
            start = time.perf_counter()
            multicallable(b"x", timeout=5)
            latencies.append(time.perf_counter() - start)

    def run():
        for _ in range(100):
            multicallable(b"w", timeout=5)

    await asyncio.to_thread(run)
    await attempts_seen(target)
    await asyncio.gather(*(asyncio.to_thread(worker) for _ in range(concurrency)))
    return summarize(latencies, await attempts_seen(target), calls)


def healthy_p95(latencies_ms) -> float:
    """p95 of the calls that did not meet a slow backend (seconds): the hedging delay to use."""
    fast = sorted(x for x in latencies_ms if x < SLOW_S * 1000 / 2)
    return fast[int(0.95 * len(fast))] / 1000


async def run(calls: int, concurrency: int) -> dict:
    import grpc_retry
    import grpc_retry.aio

    process, target = start_backends()
    try:
        # Plain grpcio first, at the same concurrency: its healthy p95 becomes the hedging delay.
        plain = grpc.aio.insecure_channel(target, options=[("grpc.service_config", config(None))])
        result = {"calls": calls, "concurrency": concurrency}
        result["grpcio_no_policy"], plain_ms = await measure(plain, target, calls, concurrency)
        await plain.close()
        delay_s = healthy_p95(plain_ms)
        result["hedging_delay_ms"] = round(delay_s * 1000, 2)
        hedging = {"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": f"{delay_s:.4f}s",
                                     "nonFatalStatusCodes": ["UNAVAILABLE"]}}
        retry = {"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                                 "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}
        for name, policy in (("grpc_retry_no_policy", None), ("grpc_retry_hedging", hedging),
                             ("grpc_retry_retry", retry)):
            channel = grpc_retry.aio.insecure_channel(target, options=[("grpc.service_config", config(policy))])
            result[name], _ = await measure(channel, target, calls, concurrency)
            await channel.close()
        sync = grpc_retry.insecure_channel(target, options=[("grpc.service_config", config(hedging))])
        result["grpc_retry_sync_hedging"], _ = await measure_sync(sync, target, calls, concurrency)
        sync.close()
        unhedged = result["grpc_retry_no_policy"]["p99_ms"]
        result["hedged_p99_over_unhedged_p99"] = round(result["grpc_retry_hedging"]["p99_ms"] / unhedged, 3)
        return result
    finally:
        process.kill()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1,
                        help="calls in flight (more, on a 2-core machine, measures queueing as much as the tail)")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.calls, args.concurrency))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
