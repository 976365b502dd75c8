"""Aggregate clusters (gRFCs A37, A75) told by a real control plane, with grpcio's own xDS client on the same
control plane as the oracle: calls fail over from a leaf with no endpoints to the next; a graph with no leaf, or
deeper than gRPC allows, fails its calls as grpcio's does."""

from __future__ import annotations

from typing import Any, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import cluster_pb2  # noqa: E402
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2  # noqa: E402
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2  # noqa: E402
from support.backend import UNARY, Backend  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, route_config  # noqa: E402
from support.xds_scenario import assign, grpcio_calls, serve, until  # noqa: E402


def aggregate(name: str, children: List[str]) -> Any:
    def edit(message: Any) -> None:
        message.name = name
        message.ClearField("type")
        message.ClearField("eds_cluster_config")
        message.cluster_type.name = "envoy.clusters.aggregate"
        message.cluster_type.typed_config.Pack(aggregate_pb2.ClusterConfig(clusters=children))
    return cluster(edit)


def chain(plane: ControlPlane, depth: int, backends: List[Backend]) -> None:
    """`depth` aggregates, "a" first, each naming the next; the last names a leaf of `backends`."""
    serve(plane, {"leaf": backends})
    for k in range(depth):
        plane.set(aggregate(f"a{k}" if k else "a", [f"a{k + 1}" if k < depth - 1 else "leaf"]))


def test_sixteen_clusters_deep_is_allowed_as_on_grpcio(client: Any, plane: ControlPlane,
                                                        backends: List[Backend]) -> None:
    chain(plane, 15, backends)  # (and the leaf: 16)
    routed_to(plane, "a")
    assert client.channel("xds:///svc").unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert grpcio_calls(plane, [[]]) == [["OK", ""]]


def routed_to(plane: ControlPlane, name: str) -> None:
    plane.set(route_config(lambda config: setattr(config.virtual_hosts[0].routes[0].route, "cluster", name)))


def both_serve(client: Any, plane: ControlPlane, leaves: List[str], calls: int) -> None:
    """An aggregate "agg" of `leaves`, routed to: `calls` calls through each client all succeed."""
    plane.set(aggregate("agg", leaves))
    routed_to(plane, "agg")
    channel = client.channel("xds:///svc")
    ours = [channel.unary(UNARY, b"x", timeout=10, wait_for_ready=True).code for _ in range(calls)]
    assert ours == [grpc.StatusCode.OK] * calls
    assert [code for code, _ in grpcio_calls(plane, [[]] * calls)] == ["OK"] * calls


def test_calls_fail_over_from_a_leaf_with_no_endpoints_to_the_next(client: Any, plane: ControlPlane,
                                                                   backends: List[Backend]) -> None:
    serve(plane, {"empty": [], "full": backends[:2]})
    both_serve(client, plane, ["empty", "full"], 20)
    assert sum(len(b.attempts_of(UNARY)) for b in backends[:2]) == 40 and not backends[2].attempts_of(UNARY)


def test_the_first_leaf_with_endpoints_serves_and_the_next_takes_over(client: Any, plane: ControlPlane,
                                                                      backends: List[Backend]) -> None:
    serve(plane, {"first": backends[:1], "second": backends[1:2]})
    plane.set(aggregate("agg", ["first", "second"]))
    routed_to(plane, "agg")
    channel = client.channel("xds:///svc")
    for _ in range(5):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert len(backends[0].attempts_of(UNARY)) == 5 and not backends[1].attempts_of(UNARY)
    plane.set(endpoints(lambda e: assign(e, "first", [])))  # the first leaf loses its endpoints
    (seen,) = until(lambda: [channel.unary(UNARY, b"x", timeout=10) and len(backends[1].attempts_of(UNARY))],
                    lambda counts: counts[0] > 0)
    assert seen  # (the update reached the channel: until then the first leaf took the calls)
    before = len(backends[0].attempts_of(UNARY))
    for _ in range(5):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert len(backends[0].attempts_of(UNARY)) == before and len(backends[1].attempts_of(UNARY)) == seen + 5


@pytest.mark.parametrize("graph", ["cycle", "too deep"])
def test_a_graph_grpc_refuses_fails_its_calls_as_on_grpcio(client: Any, plane: ControlPlane,
                                                           backends: List[Backend], graph: str) -> None:
    if graph == "cycle":  # no leaf: a and b only name each other
        plane.set(aggregate("a", ["b"]))
        plane.set(aggregate("b", ["a"]))
    else:  # 16 aggregates, each naming the next, then a leaf: 17 clusters
        chain(plane, 16, backends)
    routed_to(plane, "a")
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    ((code, details),) = grpcio_calls(plane, [[]])
    assert (outcome.code.name, outcome.details) == (code, details) == ("UNAVAILABLE", (
        "aggregate cluster dependency graph for a has no leaf clusters" if graph == "cycle"
        else "aggregate cluster graph exceeds max depth"))


def test_a_logical_dns_leaf_serves_when_the_eds_leaf_has_no_endpoints(client: Any, plane: ControlPlane,
                                                                      backends: List[Backend]) -> None:
    """The aggregate's common form: an EDS cluster first, a DNS name as its fallback. Its EDS leaf has no endpoint:
    the name's address serves, on both clients."""
    serve(plane, {"eds": []})
    plane.set(cluster_pb2.Cluster(name="dns", type=cluster_pb2.Cluster.LOGICAL_DNS, load_assignment=(
        endpoint_pb2.ClusterLoadAssignment(endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[
            lb_endpoint("localhost", backends[0].port)])]))))
    both_serve(client, plane, ["eds", "dns"], 10)
    assert len(backends[0].attempts_of(UNARY)) == 20
