"""The differential drop-in suite: each scenario runs once through grpcio's own channel and once through each
grpc_retry channel (no policy, a retry policy that never triggers, a hedging policy whose hedges never go: the
attempt shapes hedged calls use, and a hedging policy whose hedges go out on every call and lose), each against
a fresh real server scripted the same way, and the observations must be equal."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict

import grpc
import pytest
from support.dropin import side_by_side

import grpc_retry
import grpc_retry.aio

# A retry policy whose retryable code no scenario produces: the layer is in place, and never retries.
IDLE_RETRY = json.dumps({"methodConfig": [{"name": [{"service": "grpc_retry.test.Echo"}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
    "retryableStatusCodes": ["DATA_LOSS"]}}]})
# A hedging policy whose next hedge is never due within a scenario: each call is its one attempt, in the shape
# hedged calls use (a unary call's attempt shows its headers before its response).
IDLE_HEDGING = json.dumps({"methodConfig": [{"name": [{"service": "grpc_retry.test.Echo"}], "hedgingPolicy": {
    "maxAttempts": 2, "hedgingDelay": "300s", "nonFatalStatusCodes": ["DATA_LOSS"]}}]})
# A hedging policy whose hedge goes out on every call: its server (support.dropin) holds each first attempt until
# the hedge has arrived, and holds the hedge until it is cancelled, so the first attempt answers the call, and the
# application must see what it sees without hedging.
HEDGES = json.dumps({"methodConfig": [{"name": [{"service": "grpc_retry.test.Echo"}], "hedgingPolicy": {
    "maxAttempts": 2, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["DATA_LOSS"]}}]})


def _with_policy(make: Callable[..., Any], config: str = IDLE_RETRY) -> Callable[..., Any]:
    def channel(target: str, options: Any = None, **kwargs: Any) -> Any:
        return make(target, options=list(options or ()) + [("grpc.service_config", config)], **kwargs)
    channel.hedges = config is HEDGES  # type: ignore[attr-defined]  # (side_by_side: a server whose hedges lose)
    return channel


SYNC: Dict[str, Callable[..., Any]] = {
    "grpc_retry": grpc_retry.insecure_channel,
    "grpc_retry+retry": _with_policy(grpc_retry.insecure_channel),
    "grpc_retry+hedging": _with_policy(grpc_retry.insecure_channel, IDLE_HEDGING),
    "grpc_retry+hedges": _with_policy(grpc_retry.insecure_channel, HEDGES),
}
AIO: Dict[str, Callable[..., Any]] = {
    "grpc_retry.aio": grpc_retry.aio.insecure_channel,
    "grpc_retry.aio+retry": _with_policy(grpc_retry.aio.insecure_channel),
    "grpc_retry.aio+hedging": _with_policy(grpc_retry.aio.insecure_channel, IDLE_HEDGING),
    "grpc_retry.aio+hedges": _with_policy(grpc_retry.aio.insecure_channel, HEDGES),
}


@pytest.fixture(params=sorted(SYNC))
def sync_channel(request):
    return SYNC[request.param]


@pytest.fixture(params=sorted(AIO))
def aio_channel(request):
    return AIO[request.param]


@pytest.fixture
def same_as_grpcio():
    return lambda scenario, ours: side_by_side(scenario, ours, grpc.insecure_channel)


@pytest.fixture
def hedged_sync_channel():
    """The sync channel whose policy hedges every call (HEDGES)."""
    return SYNC["grpc_retry+hedges"]
