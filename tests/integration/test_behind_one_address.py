"""Behind one address (an L4 balancer: a Kubernetes ClusterIP, a cloud network load balancer) the backends are
reached through connections, not addresses: with `grpc_retry.connections_per_address` each connection is a
subchannel of its own, and a retry goes down a connection the call has not used — usually another backend.
Real grpcio servers behind a real TCP balancer on loopback; both APIs."""

from __future__ import annotations

import json

import grpc
import pytest
from support.backend import UNARY, Backend, Step, fail
from support.l4 import L4Balancer

import grpc_retry

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)

SERVICE = "grpc_retry.test.Echo"


def config(lb: str = "round_robin", **extra: object) -> str:
    return json.dumps({"loadBalancingConfig": [{lb: {}}], "methodConfig": [{
        "name": [{"service": SERVICE}], "retryPolicy": {
            "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
            "retryableStatusCodes": ["UNAVAILABLE"]}}], **extra})


@pytest.fixture
def behind_one_address():
    """Three backends behind one L4 address, rotating connections; the third fails every call."""
    backends = [Backend() for _ in range(3)]
    backends[2].fallback(UNARY, lambda i: fail())
    balancer = L4Balancer([b.target for b in backends], "rotate")
    yield balancer, backends
    balancer.close()
    for backend in backends:
        backend.stop()


@pytest.mark.parametrize("lb", ["pick_first", "round_robin"])
def test_fresh_channels_retry_on_another_connection_and_another_backend(client, behind_one_address, lb):
    balancer, backends = behind_one_address
    outcomes = {}
    for connections in (1, 3):
        codes = []
        for _ in range(12):  # fresh channels, as short-lived clients (a CLI, a job) make them
            channel = client.channel(balancer.target, [("grpc.service_config", config(lb)),
                                                       ("grpc_retry.connections_per_address", connections)])
            codes.append(channel.unary(UNARY, b"x", timeout=10).code)
            channel.close()
        outcomes[connections] = codes.count(grpc.StatusCode.OK)
    # One connection: a retry goes down the same connection to the same failing backend (every third channel).
    assert outcomes[1] < 12
    assert outcomes[3] == 12, outcomes


def test_round_robin_spreads_calls_over_the_connections(client, behind_one_address):
    balancer, backends = behind_one_address
    backends[2].fallback(UNARY, lambda i: Step())  # all healthy here
    channel = client.channel(balancer.target, [("grpc.service_config", config()),
                                               ("grpc_retry.connections_per_address", 3)])
    for _ in range(30):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    # Evenly once every connection is up; the first calls may go before all three are (one more here or there).
    assert all(8 <= len(b.attempts_of(UNARY)) <= 12 for b in backends), [len(b.attempts_of(UNARY)) for b in backends]
    assert balancer.connections == [1, 1, 1]


def test_connections_per_address_is_checked_at_creation():
    for bad in (0, -1, "2", 1.5, True):
        with pytest.raises(ValueError, match="grpc_retry.connections_per_address"):
            grpc_retry.insecure_channel("127.0.0.1:1", options=[("grpc_retry.connections_per_address", bad)])
