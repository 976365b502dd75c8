"""The differential drop-in suite: each scenario runs once through grpcio's own channel and once through each
grpc_retry channel (no policy, and a retry policy that never triggers), each against a fresh real server scripted
the same way, and the observations must be equal."""

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


def _with_policy(make: Callable[..., Any]) -> Callable[..., Any]:
    def channel(target: str, options: Any = None, **kwargs: Any) -> Any:
        return make(target, options=list(options or ()) + [("grpc.service_config", IDLE_RETRY)], **kwargs)
    return channel


SYNC: Dict[str, Callable[..., Any]] = {
    "grpc_retry": grpc_retry.insecure_channel,
    "grpc_retry+retry": _with_policy(grpc_retry.insecure_channel),
}
AIO: Dict[str, Callable[..., Any]] = {
    "grpc_retry.aio": grpc_retry.aio.insecure_channel,
    "grpc_retry.aio+retry": _with_policy(grpc_retry.aio.insecure_channel),
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
