"""ring_hash (gRFC A42) told by a real control plane, with grpcio's own xDS client on the same control plane as the
oracle: a header's value reaches the same endpoint through both clients (a mixed fleet keeps its cache affinity);
a retry goes to the next endpoint on the ring rather than back to the failing one (grpcio's goes back); the
channel-id policy keeps one channel's calls on one endpoint; `xds_status()` names the policy."""

from __future__ import annotations

from typing import Any, Dict, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import cluster_pb2  # noqa: E402
from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.backend import UNARY, Backend, fail  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint  # noqa: E402
from support.xds_scenario import grpcio_calls, route_retries, serve, until  # noqa: E402

import grpc_retry  # noqa: E402

HashPolicy = route_components_pb2.RouteAction.HashPolicy


def ring_hash(message: Any) -> None:
    message.lb_policy = cluster_pb2.Cluster.RING_HASH


def by_header(config: Any, retries: int = 0) -> None:
    route = config.virtual_hosts[0].routes[0].route
    route.hash_policy.append(HashPolicy(header=HashPolicy.Header(header_name="session")))
    if retries:
        route.retry_policy.CopyFrom(route_retries(retries))


def reached(backends: List[Backend], since: List[int]) -> Dict[str, set]:
    """Per session header value, the backends (by index) its first attempts reached since `since` (counts)."""
    seen: Dict[str, set] = {}
    for i, b in enumerate(backends):
        for attempt in b.attempts_of(UNARY)[since[i]:]:
            if attempt.previous is None:
                seen.setdefault(attempt.metadata.get("session", ""), set()).add(i)
    return seen


def test_a_header_reaches_the_same_endpoint_as_through_grpcio(client: Any, plane: ControlPlane,
                                                              backends: List[Backend]) -> None:
    extra = [Backend()]
    fleet = backends + extra
    try:
        serve(plane, {"c1": fleet}, by_header)
        plane.set(cluster(lambda c: (setattr(c, "name", "c1"), ring_hash(c))))
        values = [f"user-{k}" for k in range(12)]
        calls = [[["session", v]] for v in values for _ in range(4)]
        channel = client.channel("xds:///svc")
        until(lambda: [r.lb_policy for r in grpc_retry.xds_status() if r.type == "Cluster" and r.name == "c1"
                       and r.server == plane.target], lambda found: found == ["ring_hash"])
        for metadata in calls:
            assert channel.unary(UNARY, b"x", timeout=10, metadata=metadata).code == grpc.StatusCode.OK
        ours = reached(fleet, [0] * len(fleet))
        counts = [len(b.attempts_of(UNARY)) for b in fleet]
        assert all(code == "OK" for code, _ in grpcio_calls(plane, calls))
        theirs = reached(fleet, counts)
        assert all(len(ours[v]) == 1 for v in values), ours  # each value keeps to one endpoint
        assert ours == theirs
        assert len(set().union(*ours.values())) >= 2  # (and the values spread)
        (routes,) = [r for r in grpc_retry.xds_status() if r.type == "RouteConfiguration" and r.server == plane.target]
        assert routes.hash_policies == "* route 0: header session"
    finally:
        for b in extra:
            b.stop()


def test_a_retry_goes_to_the_next_endpoint_on_the_ring(client: Any, plane: ControlPlane,
                                                       backends: List[Backend]) -> None:
    serve(plane, {"c1": backends}, lambda config: by_header(config, retries=2))
    plane.set(cluster(lambda c: (setattr(c, "name", "c1"), ring_hash(c))))
    channel = client.channel("xds:///svc")
    until(lambda: [r.lb_policy for r in grpc_retry.xds_status() if r.type == "Cluster" and r.name == "c1"
                   and r.server == plane.target], lambda found: found == ["ring_hash"])
    assert channel.unary(UNARY, b"x", timeout=10, metadata=[("session", "s1")]).code == grpc.StatusCode.OK
    (home,) = [i for i, b in enumerate(backends) if b.attempts_of(UNARY)]
    backends[home].fallback(UNARY, lambda i: fail())
    for _ in range(5):
        assert channel.unary(UNARY, b"x", timeout=10, metadata=[("session", "s1")]).code == grpc.StatusCode.OK
    retried = [i for i, b in enumerate(backends) if i != home and b.attempts_of(UNARY)]
    assert len(retried) == 1  # every retry to the one next on the ring: the fallback keeps affinity too
    assert all(a.previous == "1" for a in backends[retried[0]].attempts_of(UNARY))
    assert len(backends[home].attempts_of(UNARY)) == 6  # each call still tries its own endpoint first


def test_the_channel_id_keeps_a_channels_calls_on_one_endpoint(client: Any, plane: ControlPlane,
                                                              backends: List[Backend]) -> None:
    def by_channel(config: Any) -> None:
        config.virtual_hosts[0].routes[0].route.hash_policy.append(
            HashPolicy(filter_state=HashPolicy.FilterState(key="io.grpc.channel_id")))
    serve(plane, {"c1": backends}, by_channel)
    plane.set(cluster(lambda c: (setattr(c, "name", "c1"), ring_hash(c))))
    channel = client.channel("xds:///svc")
    until(lambda: [r.lb_policy for r in grpc_retry.xds_status() if r.type == "Cluster" and r.name == "c1"
                   and r.server == plane.target], lambda found: found == ["ring_hash"])
    for _ in range(10):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert sorted(len(b.attempts_of(UNARY)) for b in backends) == [0, 0, 10]


def test_each_endpoints_share_of_the_hashes_is_its_weights(client: Any, plane: ControlPlane,
                                                          backends: List[Backend]) -> None:
    """Weights 1, 2 and 5 (EDS load_balancing_weight): 800 calls, each its own header value, reach the endpoints
    grpcio's client sends them to, in shares near 1/8, 2/8 and 5/8 (the ring's arcs and the sample both vary with
    the endpoints' ports: a few points either way)."""
    weights = [1, 2, 5]

    def weighted(message: Any) -> None:
        message.cluster_name = "c1"
        del message.endpoints[0].lb_endpoints[:]
        message.endpoints[0].lb_endpoints.extend(
            lb_endpoint("127.0.0.1", b.port, load_balancing_weight=wrappers_pb2.UInt32Value(value=w))
            for b, w in zip(backends, weights, strict=True))
    serve(plane, {"c1": backends}, by_header)
    plane.set(cluster(lambda c: (setattr(c, "name", "c1"), ring_hash(c))))
    plane.set(endpoints(weighted))
    channel = client.channel("xds:///svc")
    until(lambda: [r.lb_policy for r in grpc_retry.xds_status() if r.type == "Cluster" and r.name == "c1"
                   and r.server == plane.target], lambda found: found == ["ring_hash"])
    calls = [[["session", f"v{k}"]] for k in range(800)]
    for metadata in calls:
        assert channel.unary(UNARY, b"x", timeout=10, metadata=metadata).code == grpc.StatusCode.OK
    ours = reached(backends, [0] * len(backends))
    counts = [len(b.attempts_of(UNARY)) for b in backends]
    assert all(code == "OK" for code, _ in grpcio_calls(plane, calls))
    assert ours == reached(backends, counts)
    shares = [n / 800 for n in counts]
    for share, weight in zip(shares, weights, strict=True):
        assert abs(share - weight / 8) < 0.1, shares
