"""An xDS cluster's retry budget (its DEFAULT circuit-breaker threshold's `retry_budget` and `max_retries`, which
grpcio's own client ignores: gRFC A44), told by a real control plane: it bounds the retries of that cluster's calls
in flight at once, and only that cluster's; `xds_status()` shows it."""

from __future__ import annotations

import concurrent.futures
from typing import Any, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.type.v3 import percent_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.backend import UNARY, Backend, fail  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.xds_resources import cluster, route_config  # noqa: E402
from support.xds_scenario import route_retries, serve, until  # noqa: E402

import grpc_retry  # noqa: E402


def budgeted(name: str, percent: float, floor: int) -> Any:
    def edit(message: Any) -> None:
        message.name = name
        budget = message.circuit_breakers.thresholds.add().retry_budget
        budget.budget_percent.CopyFrom(percent_pb2.Percent(value=percent))
        budget.min_retry_concurrency.CopyFrom(wrappers_pb2.UInt32Value(value=floor))
    return cluster(edit)


def retried(config: Any) -> None:
    config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(route_retries(2))


def test_a_clusters_retry_budget_bounds_its_retries_in_flight(client: Any, plane: ControlPlane,
                                                             backends: List[Backend]) -> None:
    serve(plane, {"c1": backends}, retried)
    plane.set(budgeted("c1", 0, 1))
    for b in backends:
        b.fallback(UNARY, lambda i: fail(wait=0.15))
    channel = client.channel("xds:///svc")
    (held,) = until(lambda: [r for r in grpc_retry.xds_status() if r.type == "Cluster" and r.name == "c1"
                             and r.server == plane.target and r.retry_budget],
                    lambda found: len(found) == 1)
    assert held.retry_budget == "retries in flight at most 0% of the calls in flight, and at least 1"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: channel.unary(UNARY, b"x", timeout=10).code, range(8)))
    assert codes == [grpc.StatusCode.UNAVAILABLE] * 8
    retries = [a for b in backends for a in b.attempts_of(UNARY) if a.previous is not None]
    assert retries
    most = max(sum(1 for b in retries if b.arrived <= a.arrived < (b.ended or a.arrived + 1)) for a in retries)
    assert most == 1, most


def test_a_clusters_budget_applies_to_its_calls_only(client: Any, plane: ControlPlane,
                                                     backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1], "c2": backends[1:]}, retried)
    plane.set(budgeted("c1", 0, 0))  # no retry at all for c1's calls
    for b in backends:
        b.fallback(UNARY, lambda i: fail())
    channel = client.channel("xds:///svc")
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.UNAVAILABLE
    assert len(backends[0].attempts_of(UNARY)) == 1

    def to_c2(config: Any) -> None:
        retried(config)
        config.virtual_hosts[0].routes[0].route.cluster = "c2"
    plane.set(route_config(to_c2))
    until(lambda: [channel.unary(UNARY, b"x", timeout=10)] and [len(b.attempts_of(UNARY)) for b in backends[1:]],
          lambda seen: sum(seen) >= 3)
    before = sum(len(b.attempts_of(UNARY)) for b in backends[1:])
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.UNAVAILABLE
    # c2's calls: every attempt the route allows
    assert sum(len(b.attempts_of(UNARY)) for b in backends[1:]) - before == 3
