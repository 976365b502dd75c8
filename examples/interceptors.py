"""An asyncio client interceptor over a grpc_retry channel: it sees one logical call (with its final status),
not each attempt; the retries happen beneath it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, List, Tuple

import grpc
from _server import CALL, Server
from grpc import aio

import grpc_retry.aio

SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "demo.Echo"}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.05s", "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})


class Logging(aio.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.seen: List[Tuple[str, grpc.StatusCode]] = []

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: aio.ClientCallDetails,
                                    request: Any) -> Any:
        call = await continuation(details, request)
        self.seen.append((details.method, await call.code()))
        print(f"  interceptor: {details.method} ended {await call.code()}")
        return call


async def main() -> None:
    server = Server(fail_first=2)
    interceptor = Logging()
    async with grpc_retry.aio.insecure_channel(f"127.0.0.1:{server.port}", interceptors=[interceptor],
                                               options=[("grpc.service_config", SERVICE_CONFIG)]) as channel:
        print("client:", await channel.unary_unary(CALL)(b"intercepted", timeout=5))
    assert len(interceptor.seen) == 1 and len(server.attempts) == 3
    server.stop()


asyncio.run(main())
