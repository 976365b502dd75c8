"""A retried call against a local flaky server: the server fails the first two attempts with UNAVAILABLE,
grpc_retry retries them per the service config, and the application sees one successful call."""

from __future__ import annotations

import asyncio
import json
from typing import List

import grpc

import grpc_retry.aio

SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "demo.Flaky"}],
        "retryPolicy": {
            "maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "0.5s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
})


async def main() -> None:
    attempts: List[str] = []

    async def hello(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        previous = str(dict(context.invocation_metadata() or ()).get("grpc-previous-rpc-attempts", "0"))
        attempts.append(previous)
        print(f"server: attempt with grpc-previous-rpc-attempts={previous}")
        if len(attempts) < 3:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return b"hello, " + request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "demo.Flaky", {"Hello": grpc.unary_unary_rpc_method_handler(hello)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async with grpc_retry.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.service_config", SERVICE_CONFIG)]) as channel:
        call = channel.unary_unary("/demo.Flaky/Hello")(b"world", timeout=5)
        print("client: response", await call)
        print("client: trailing metadata", tuple(await call.trailing_metadata()))
    assert len(attempts) == 3, attempts
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main())
