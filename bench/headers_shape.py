"""What a unary call that shows its response headers first costs, on plain grpc.aio (no retry layer): CPU per
call of each shape divided by a grpc.aio unary call's, in alternating rounds.

- "unary_stream": grpcio's cheapest public shape that reports headers first, a unary-stream call with one response
  whose headers are awaited before its message (grpc_retry's sync channel hedges unary calls in it);
- "two_batches": the attempt grpc_retry's asyncio channel hedges unary calls in (`AioMethod`, headers first), two
  batches on grpc.aio's Cython call, in flight together: the request with the headers, and the response with the status.

Prints one JSON object as its last line. Usage: python bench/headers_shape.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import grpc
from overhead import PAYLOAD, SERVICE, start_server


async def _measure(target: str, calls: int, rounds: int) -> dict:
    from grpc_retry._transport.direct_aio import AioMethod

    channel = grpc.aio.insecure_channel(target)
    unary, one = channel.unary_unary(f"/{SERVICE}/Unary"), channel.unary_stream(f"/{SERVICE}/One")
    headers_first = AioMethod(unary, True)

    async def unary_call():
        await unary(PAYLOAD)

    async def unary_stream_call():
        call = one(PAYLOAD)
        await call.initial_metadata()
        await call.read()
        await call.code()

    async def two_batches_call():
        attempt = headers_first(PAYLOAD, timeout=None, metadata=(), credentials=None, wait_for_ready=None,
                                compression=None)
        await attempt.code()

    shapes = {"unary": unary_call, "unary_stream": unary_stream_call, "two_batches": two_batches_call}
    result: dict = {}
    for inflight in (1, 16):
        samples: dict = {name: [] for name in shapes}
        for r in range(rounds):
            order = list(shapes.items())
            for name, make in (order if r % 2 == 0 else order[::-1]):
                async def worker(n, make=make):
                    for _ in range(n):
                        await make()

                start = time.process_time()
                await asyncio.gather(*(worker(calls // inflight) for _ in range(inflight)))
                samples[name].append((time.process_time() - start) / calls)
        for name in ("unary_stream", "two_batches"):
            result.setdefault(name, {})[str(inflight)] = round(statistics.median(
                s / u for s, u in zip(samples[name], samples["unary"], strict=True)), 3)
    await channel.close()
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    process, port = start_server()
    target = f"127.0.0.1:{port}"
    try:
        ratios = asyncio.run(_measure(target, args.calls, args.rounds))
    finally:
        process.kill()
    result = {"grpcio": grpc.__version__, "over_unary": ratios}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
