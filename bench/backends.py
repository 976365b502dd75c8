"""Success rate of calls with maxAttempts 2 against three backends, one of which always fails UNAVAILABLE:
through grpc_retry (both APIs), whose retry never goes back to the backend the call used, and through a plain
grpcio channel with the same service config and round_robin, whose retry goes wherever the rotation is.

The calls run concurrently (as a busy client's do), so grpcio's rotation is shared between calls and a
retry lands on the failing backend again about one time in three.

Prints one JSON object as its last line. Usage: python bench/backends.py [--calls N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing

import grpc

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
BACKENDS = 3
SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
        "name": [{"service": SERVICE}],
        "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }],
})


def _serve(port_queue) -> None:
    """Three servers in this process; the first always fails."""
    async def run():
        async def echo(request, context):
            return request

        async def unavailable(request, context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this backend always fails")

        servers, ports = [], []  # keep the servers referenced: a collected grpc.aio server stops
        for handler in [unavailable] + [echo] * (BACKENDS - 1):
            server = grpc.aio.server()
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
                SERVICE, {"Unary": grpc.unary_unary_rpc_method_handler(handler)})])
            ports.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            servers.append(server)
        port_queue.put(ports)
        await asyncio.Event().wait()

    asyncio.run(run())


def start_servers():
    # A fresh interpreter (spawn), not a fork of this one: nothing of the parent's grpcio state is inherited.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_serve, args=(queue,), daemon=True)
    process.start()
    ports = queue.get(timeout=30)
    return process, "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)


async def _aio_rate(channel, calls: int, concurrency: int) -> float:
    unary = channel.unary_unary(UNARY)
    slots = asyncio.Semaphore(concurrency)

    async def one() -> bool:
        async with slots:
            try:
                await unary(b"x", timeout=30)
                return True
            except grpc.aio.AioRpcError:
                return False

    async with channel:
        try:  # connect first: rates, not start-up (the warm-up call itself may meet the failing backend)
            await unary(b"warm-up", timeout=30, wait_for_ready=True)
        except grpc.aio.AioRpcError:
            pass
        return sum(await asyncio.gather(*(one() for _ in range(calls)))) / calls


def aio_rate(make_channel, target: str, calls: int, concurrency: int) -> float:
    async def run():
        return await _aio_rate(make_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)]),
                               calls, concurrency)

    return asyncio.run(run())


def sync_rate(target: str, calls: int, concurrency: int) -> float:
    import grpc_retry

    with grpc_retry.insecure_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)]) as channel:
        unary = channel.unary_unary(UNARY)
        try:
            unary(b"warm-up", timeout=30, wait_for_ready=True)
        except grpc.RpcError:
            pass

        def one(_) -> bool:
            try:
                unary(b"x", timeout=30)
                return True
            except grpc.RpcError:
                return False

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            return sum(pool.map(one, range(calls))) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    import grpc_retry.aio  # the installed package: the source tree has no compiled core

    process, target = start_servers()
    try:
        figures = {
            "calls": args.calls,
            "concurrency": args.concurrency,
            "backends": BACKENDS,
            "failing_backends": 1,
            "max_attempts": 2,
            "grpc_retry_aio": aio_rate(grpc_retry.aio.insecure_channel, target, args.calls, args.concurrency),
            # The sync API blocks a thread per call in flight: fewer of them, same shared-rotation effect.
            "grpc_retry_sync": sync_rate(target, args.calls, min(args.concurrency, 16)),
            "grpcio": aio_rate(grpc.aio.insecure_channel, target, args.calls, args.concurrency),
        }
    finally:
        process.terminate()
        process.join(10)
    print(f"success rate over {args.calls} calls: grpc_retry aio {figures['grpc_retry_aio']:.2%}, "
          f"sync {figures['grpc_retry_sync']:.2%}; plain grpcio round_robin {figures['grpcio']:.2%}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
