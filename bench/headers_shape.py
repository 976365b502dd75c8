"""The floor under a hedged unary call's cost, measured on plain grpc.aio (no grpc_retry): CPU per call of a
unary-stream call with one response whose headers are awaited before its message (grpcio's cheapest shape that
reports headers first, which hedging needs) divided by a unary call, in alternating rounds.

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
    channel = grpc.aio.insecure_channel(target)
    unary, one = channel.unary_unary(f"/{SERVICE}/Unary"), channel.unary_stream(f"/{SERVICE}/One")

    async def unary_call():
        await unary(PAYLOAD)

    async def headers_first_call():
        call = one(PAYLOAD)
        await call.initial_metadata()
        await call.read()
        await call.code()

    result = {}
    for inflight in (1, 16):
        samples = {"unary": [], "headers_first": []}
        for r in range(rounds):
            order = (("unary", unary_call), ("headers_first", headers_first_call))
            for name, make in (order if r % 2 == 0 else order[::-1]):
                async def worker(n, make=make):
                    for _ in range(n):
                        await make()

                start = time.process_time()
                await asyncio.gather(*(worker(calls // inflight) for _ in range(inflight)))
                samples[name].append((time.process_time() - start) / calls)
        result[str(inflight)] = round(statistics.median(
            h / u for h, u in zip(samples["headers_first"], samples["unary"], strict=True)), 3)
    await channel.close()
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    process, target = start_server()
    try:
        ratios = asyncio.run(_measure(target, args.calls, args.rounds))
    finally:
        process.kill()
    result = {"grpcio": grpc.__version__, "headers_first_over_unary": ratios}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
