"""Hedging: the first attempt is slow (1 s); 50 ms later grpc_retry sends a hedge, which answers at once. The call
takes ~50 ms instead of 1 s, and the slow attempt is cancelled. grpcio ignores hedgingPolicy."""

import asyncio
import json
import time

from _server import CALL, Server

import grpc_retry.aio

SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "demo.Echo"}],
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]},
}]})


async def main() -> None:
    server = Server(slow=lambda n: n == 0, slow_s=1.0)
    async with grpc_retry.aio.insecure_channel(f"127.0.0.1:{server.port}",
                                               options=[("grpc.service_config", SERVICE_CONFIG)]) as channel:
        started = time.perf_counter()
        response = await channel.unary_unary(CALL)(b"hedge me", timeout=5)
        took = time.perf_counter() - started
        print(f"client: {response!r} in {took * 1000:.0f} ms")
    assert took < 0.5 and len(server.attempts) == 2
    server.stop()


asyncio.run(main())
