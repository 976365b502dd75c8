"""maxRequestMessageBytes / maxResponseMessageBytes of the service config are enforced per method as grpcio
enforces them: the same status and the same words, side by side, on both APIs."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from support.backend import SERVER_STREAM, UNARY

import grpc_retry
import grpc_retry.aio

CONFIG = json.dumps({"methodConfig": [
    {"name": [{"service": "grpc_retry.test.Echo", "method": "Unary"}], "maxRequestMessageBytes": 10},
    {"name": [{"service": "grpc_retry.test.Echo", "method": "ServerStream"}], "maxResponseMessageBytes": 10,
     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
                     "retryableStatusCodes": ["UNAVAILABLE"]}},
]})
CASES = [(UNARY, b"x" * 100, "unary"), (UNARY, b"small", "unary"), (SERVER_STREAM, b"y" * 100, "stream"),
         (SERVER_STREAM, b"ok", "stream")]


def _sync_outcomes(make, target):
    outcomes = []
    with make(target, options=[("grpc.service_config", CONFIG)]) as channel:
        for method, request, kind in CASES:
            try:
                if kind == "unary":
                    outcomes.append(("OK", channel.unary_unary(method)(request, timeout=5)))
                else:
                    outcomes.append(("OK", list(channel.unary_stream(method)(request, timeout=5))))
            except grpc.RpcError as error:
                outcomes.append((error.code().name, error.details()))
    return outcomes


async def _aio_outcomes(make, target):
    outcomes = []
    async with make(target, options=[("grpc.service_config", CONFIG)]) as channel:
        for method, request, kind in CASES:
            try:
                if kind == "unary":
                    outcomes.append(("OK", await channel.unary_unary(method)(request, timeout=5)))
                else:
                    outcomes.append(("OK", [m async for m in channel.unary_stream(method)(request, timeout=5)]))
            except grpc.RpcError as error:
                outcomes.append((error.code().name, error.details()))
    return outcomes


@pytest.mark.parametrize("api", ["sync", "aio"])
def test_message_size_limits_as_grpcio(backend, api):
    if api == "sync":
        theirs = _sync_outcomes(grpc.insecure_channel, backend.target)
        ours = _sync_outcomes(grpc_retry.insecure_channel, backend.target)
    else:
        theirs = asyncio.run(_aio_outcomes(grpc.aio.insecure_channel, backend.target))
        ours = asyncio.run(_aio_outcomes(grpc_retry.aio.insecure_channel, backend.target))
    assert ours == theirs
    assert [code for code, _ in ours] == ["RESOURCE_EXHAUSTED", "OK", "RESOURCE_EXHAUSTED", "OK"]
