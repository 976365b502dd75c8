"""A program as an adopting team runs it: an instrumentation (OpenTelemetry's or Sentry's gRPC one) set up before or
after `import grpc_retry`, optionally with grpc_retry.install(all_channels=True), then sync and asyncio calls
(unary, server-streaming, channel readiness) through channels of MAKER (grpc_retry's own constructors, or grpc's
constructors). Prints one JSON line of what the calls returned, for the test to compare with grpcio's.

    python tests/support/instrumented.py otel|sentry before|after grpc|grpc_retry|installed
"""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent import futures
from typing import Any, List

import grpc
import grpc.aio


def instrument(which: str) -> None:
    if which == "otel":
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcInstrumentorClient

        GrpcInstrumentorClient().instrument()
        GrpcAioInstrumentorClient().instrument()
    else:
        import sentry_sdk
        from sentry_sdk.integrations.grpc import GRPCIntegration

        sentry_sdk.init(dsn=None, integrations=[GRPCIntegration()])


def main() -> None:
    which, when, maker = sys.argv[1:4]
    if when == "before":
        instrument(which)
    import grpc_retry
    import grpc_retry.aio
    if maker == "installed":
        grpc_retry.install(all_channels=True)
    if when == "after":
        instrument(which)
    sync_make: Any = grpc_retry.insecure_channel if maker == "grpc_retry" else grpc.insecure_channel
    aio_make: Any = grpc_retry.aio.insecure_channel if maker == "grpc_retry" else grpc.aio.insecure_channel

    def unary(request: bytes, context: Any) -> bytes:
        return request

    def stream(request: bytes, context: Any) -> Any:
        for _ in range(3):
            yield request

    handler = grpc.method_handlers_generic_handler("t.S", {"U": grpc.unary_unary_rpc_method_handler(unary),
                                                           "S": grpc.unary_stream_rpc_method_handler(stream)})
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    target = f"127.0.0.1:{port}"
    seen: List[Any] = []

    def ours(channel: Any, cls: type) -> bool:
        # An instrumentation set up after install() may hand out its own wrapper (grpc.intercept_channel's) of it.
        return isinstance(channel, cls) or isinstance(getattr(channel, "_channel", None), cls)

    with sync_make(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        seen.append(["sync", ours(channel, grpc_retry.Channel),
                     channel.unary_unary("/t.S/U")(b"a", timeout=10).decode(),
                     [m.decode() for m in channel.unary_stream("/t.S/S")(b"b", timeout=10)]])

    async def run() -> None:
        async with aio_make(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            seen.append(["aio", ours(channel, grpc_retry.aio.Channel),
                         (await channel.unary_unary("/t.S/U")(b"a", timeout=10)).decode(),
                         [m.decode() async for m in channel.unary_stream("/t.S/S")(b"b", timeout=10)]])

    asyncio.run(run())
    server.stop(None)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
