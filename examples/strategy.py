"""The application-level retry strategy around a multi-call operation (read, then write): when any call of it
fails retryably, the whole operation runs again after a backoff. The channel's own retries are off
(grpc.enable_retries 0), so each try is one attempt per call on the wire."""

from __future__ import annotations

import grpc
from _server import CALL, Server

from grpc_retry.strategy import StandardRetryPolicy, StandardRetryStrategy

server = Server(fail_first=1)  # the first try's read fails
strategy = StandardRetryStrategy()
with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=[("grpc.enable_retries", 0)]) as channel:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(CALL)

    def read_then_write() -> bytes:
        read = call(b"read", timeout=5)
        return call(read + b" -> write", timeout=5)

    print("client:", strategy.retry(StandardRetryPolicy(), read_then_write))
assert len(server.attempts) == 3  # the failed read, then read and write
server.stop()
