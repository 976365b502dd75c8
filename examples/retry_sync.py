"""Retries on the sync API: the server fails the first two attempts; the application sees one successful call.
The only change from plain grpcio is the channel constructor."""

import json

from _server import CALL, Server

import grpc_retry

SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "demo.Echo"}],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "0.5s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})

server = Server(fail_first=2)
with grpc_retry.insecure_channel(f"127.0.0.1:{server.port}",
                                 options=[("grpc.service_config", SERVICE_CONFIG)]) as channel:
    response, call = channel.unary_unary(CALL).with_call(b"hello", timeout=5)
    print("client:", response, "trailing metadata:", call.trailing_metadata())
    print("client: retry statistics:")
    print(channel.retry_stats())
assert len(server.attempts) == 3
server.stop()
