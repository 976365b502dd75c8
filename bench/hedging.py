"""Tail latency with and without hedging: 2,000 unary calls against three backends that answer in ~1 ms but
take 100 ms in 5% of calls (each attempt draws on its own).

Configurations, in one run against the same backends: no policy through plain grpc.aio (round_robin over
the same three addresses); no policy, a hedging policy whose hedgingDelay is the healthy p95 of the plain run,
and a retry policy, all through grpc_retry.aio; and the hedging policy through the sync grpc_retry channel.
Attempts per call are counted by the servers.

With --adaptive: at 1, 8 and 32 calls in flight, the unhedged p99, the fixed delay (tuned at one call in flight)
and grpc_retry's adaptive hedging (grpc_retry.hedging_quantile 0.95, grpc_retry.max_extra_load 0.05, the same
config delay as its floor), each measured (4,000 calls) after half as many at the same concurrency, so that the
adaptive delay is measured under the load it learned; then, with one call in flight, the servers' latency
doubles and the run reports how long the adaptive delay takes to follow.

Prints one JSON object as its last line. Usage: python bench/hedging.py [--calls N] [--concurrency C]
[--slow-share S] [--adaptive [--quantile Q] [--max-extra-load L]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import time
from typing import Optional

import grpc

SERVICE = "bench.Tail"
CALL = f"/{SERVICE}/Call"
COUNT = f"/{SERVICE}/Count"
SCALE = f"/{SERVICE}/Scale"
SLOW_SHARE, SLOW_S, FAST_S = 0.05, 0.100, 0.001


def _serve(port_queue, slow_share: float) -> None:
    async def run():
        servers, attempts, scale = [], [0], [1.0]

        async def call(request, context):
            attempts[0] += 1
            await asyncio.sleep((SLOW_S if random.random() < slow_share else FAST_S) * scale[0])
            return request

        async def set_scale(request, context):  # every latency times this factor from now on
            scale[0] = float(request.decode())
            return b""

        async def count(request, context):
            n, attempts[0] = attempts[0], 0
            return str(n).encode()

        for _ in range(3):
            server = grpc.aio.server()
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
                "Call": grpc.unary_unary_rpc_method_handler(call),
                "Count": grpc.unary_unary_rpc_method_handler(count),
                "Scale": grpc.unary_unary_rpc_method_handler(set_scale),
            })])
            port_queue.put(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            servers.append(server)
        await asyncio.gather(*(s.wait_for_termination() for s in servers))

    asyncio.run(run())


def start_backends(slow_share: float = SLOW_SHARE):
    # A fresh interpreter (spawn), not a fork of this one: nothing of the parent's grpcio state is inherited.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_serve, args=(queue, slow_share), daemon=True)
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


async def measure(channel, target: str, calls: int, concurrency: int, warmup: int = 0):
    """Latencies of `calls` calls, `concurrency` at a time, after 100 one at a time (every connection up) and
    `warmup` more at the same concurrency (an adaptive delay learns the load it is measured under)."""
    multicallable = channel.unary_unary(CALL)
    for _ in range(100):
        await multicallable(b"w", timeout=5)
    latencies = []

    async def run(n: int) -> None:
        queue = list(range(n))

        async def worker():
            while queue:
                queue.pop()
                start = time.perf_counter()
                await multicallable(b"x", timeout=5)
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    await run(warmup)
    latencies.clear()
    await attempts_seen(target)
    await run(calls)
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


async def run(calls: int, concurrency: int, slow_share: float) -> dict:
    import grpc_retry
    import grpc_retry.aio

    process, target = start_backends(slow_share)
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


ADAPTIVE = [("grpc_retry.hedging_quantile", 0.95), ("grpc_retry.max_extra_load", 0.05)]


def cpu_seconds(pid: int) -> Optional[float]:
    """A process's CPU time so far (user and system, every thread), where /proc tells it; else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_adaptive(calls: int, slow_share: float) -> dict:
    import grpc_retry.aio

    process, target = start_backends(slow_share)
    try:
        plain = grpc.aio.insecure_channel(target, options=[("grpc.service_config", config(None))])
        _, plain_ms = await measure(plain, target, calls, 1)
        await plain.close()
        delay_s = healthy_p95(plain_ms)
        hedging = {"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": f"{delay_s:.4f}s",
                                     "nonFatalStatusCodes": ["UNAVAILABLE"]}}
        result: dict = {"calls": calls, "slow_share": slow_share, "fixed_delay_ms": round(delay_s * 1000, 2),
                        "adaptive_options": dict(ADAPTIVE)}
        for concurrency in (1, 8, 32):
            row = {}
            for name, policy, extra in (("unhedged", None, []), ("fixed", hedging, []),
                                        ("adaptive", hedging, ADAPTIVE)):
                channel = grpc_retry.aio.insecure_channel(
                    target, options=[("grpc.service_config", config(policy))] + extra)
                busy, began = cpu_seconds(process.pid), time.monotonic()
                row[name], _ = await measure(channel, target, calls, concurrency, warmup=calls // 2)
                after = cpu_seconds(process.pid)
                if busy is not None and after is not None:  # how much of a core the three backends' process used
                    row[name]["servers_cores"] = round((after - busy) / (time.monotonic() - began), 2)
                if extra:
                    stats = channel.retry_stats()[CALL]
                    row[name]["delay_ms"] = round((stats.hedging_delay or 0.0) * 1000, 2)
                    row[name]["hedges_not_sent_for_budget"] = stats.hedges_not_sent_for_budget
                await channel.close()
            for name in ("fixed", "adaptive"):
                row[f"{name}_p99_over_unhedged_p99"] = round(row[name]["p99_ms"] / row["unhedged"]["p99_ms"], 3)
            result[f"in_flight_{concurrency}"] = row
        result["latency_doubles"] = await follow_step(target, hedging)
        return result
    finally:
        process.kill()


async def follow_step(target: str, hedging: dict) -> dict:
    """One call in flight (the servers' latency, not the client's queueing, makes the delay) through the adaptive
    channel, against the servers at twice their usual latency (2 ms answers: a step of 1 ms would hardly show
    above the client's own scatter); after 10 s their latency doubles again. The delay settles (its median 10 to
    15 s after the step): how long after the step does its median over the last second first cover 75% of the way
    from before (its median over the 2 s before) to settled (its rise time)?"""
    import grpc_retry.aio

    channel = grpc_retry.aio.insecure_channel(target, options=[("grpc.service_config", config(hedging))] + ADAPTIVE)
    multicallable = channel.unary_unary(CALL)
    stop = asyncio.Event()

    async def worker():
        while not stop.is_set():
            await multicallable(b"x", timeout=5)

    def delay() -> float:
        return channel.retry_stats()[CALL].hedging_delay or 0.0

    def median(values: list) -> float:
        return sorted(values)[len(values) // 2]

    async def scale(factor: bytes) -> None:  # the three servers share one process, and one scale
        async with grpc.aio.insecure_channel(target.split(",")[0].replace("ipv4:", "")) as control:
            await control.unary_unary(SCALE)(factor)

    await scale(b"2")
    workers = [asyncio.ensure_future(worker())]
    try:
        await asyncio.sleep(8)
        samples = []
        for _ in range(20):
            await asyncio.sleep(0.1)
            samples.append(delay())
        before = median(samples)
        await scale(b"4")
        changed = time.monotonic()
        seen = []
        while time.monotonic() - changed < 15:
            await asyncio.sleep(0.1)
            seen.append((time.monotonic() - changed, delay()))
        settled = median([d for t, d in seen if t >= 10])
        mark = before + 0.75 * (settled - before)
        followed = next((t for t, _ in seen if t >= 1 and median([d for u, d in seen if t - 1 <= u <= t]) >= mark),
                        None)
        return {"delay_before_ms": round(before * 1000, 2), "delay_settled_ms": round(settled * 1000, 2),
                "followed_within_s": None if followed is None else round(followed, 1)}
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await channel.close()
        await scale(b"1")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, help="calls per row (default: 2,000; 4,000 with --adaptive)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="calls in flight (more, on a 2-core machine, measures queueing as much as the tail)")
    parser.add_argument("--adaptive", action="store_true",
                        help="fixed delay vs grpc_retry's adaptive hedging at 1, 8 and 32 in flight, and a step")
    parser.add_argument("--quantile", type=float, default=0.95, help="(--adaptive) grpc_retry.hedging_quantile")
    parser.add_argument("--max-extra-load", type=float, default=0.05,
                        help="(--adaptive) grpc_retry.max_extra_load")
    parser.add_argument("--slow-share", type=float, default=SLOW_SHARE,
                        help="share of attempts the backends hold 100 ms (0: every answer ~1 ms, the floor any "
                             "hedging reaches at each load)")
    args = parser.parse_args(argv)
    ADAPTIVE[:] = [("grpc_retry.hedging_quantile", args.quantile), ("grpc_retry.max_extra_load", args.max_extra_load)]
    args.calls = args.calls or (4000 if args.adaptive else 2000)
    result = asyncio.run(run_adaptive(args.calls, args.slow_share) if args.adaptive
                         else run(args.calls, args.concurrency, args.slow_share))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
