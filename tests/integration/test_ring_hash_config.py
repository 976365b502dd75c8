"""The service config's ring_hash_experimental (gRFC A42) on a plain target, through both APIs against real servers:
each call has a random hash (outside xDS no policy gives one), so calls spread over the addresses; a retry goes on
along the ring to an address the call has not used."""

from __future__ import annotations

import json
from typing import Any, List

import grpc
from support.backend import UNARY, Backend, fail
from support.clients import service_config

RING = {"loadBalancingConfig": [{"ring_hash_experimental": {"minRingSize": 64, "maxRingSize": 256}}]}


def options(policy: Any = None) -> List[Any]:
    config = json.loads(service_config(policy))
    return [("grpc.service_config", json.dumps({**config, **RING}))]


def test_calls_spread_and_a_retry_leaves_the_failing_address(client: Any, backends: List[Backend]) -> None:
    target = "ipv4:" + ",".join(b.target for b in backends)
    channel = client.channel(target, options({"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                                              "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}))
    for _ in range(30):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert all(b.attempts_of(UNARY) for b in backends)  # random hashes: every address takes calls
    before = len(backends[0].attempts_of(UNARY))
    backends[0].fallback(UNARY, lambda i: fail())
    for _ in range(30):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    failed = backends[0].attempts_of(UNARY)[before:]
    retried = [a for b in backends[1:] for a in b.attempts_of(UNARY) if a.previous is not None]
    assert failed and all(a.previous is None for a in failed)  # no retry went back to it
    assert len(retried) == len(failed)  # each failed call's retry went to another address
