"""`xds:` channels beside grpcio's own xDS client on one real control plane (the oracle): calls when a listener or
cluster is deleted, drops, refuses or has no endpoint, under max_stream_duration, and routes and retries, end as
grpcio's do."""

from __future__ import annotations

import collections
import time
from typing import Any, Dict, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from support.backend import UNARY, Backend, Step, fail  # noqa: E402
from support.control_plane import CLUSTER, LISTENER, ControlPlane  # noqa: E402
from support.deploy import free_port  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, listener, route_config  # noqa: E402
from support.xds_scenario import GrpcioClient, assign, grpcio_calls, route_retries, serve, until  # noqa: E402


@pytest.mark.parametrize("deleted", ["listener", "cluster", "listener, on a server trusted to keep it"])
def test_a_deleted_listener_or_cluster_fails_calls_as_on_grpcio(client: Any, plane: ControlPlane,
                                                                 backends: List[Backend], deleted: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A Listener or Cluster deleted after a config (A53): calls fail UNAVAILABLE with grpcio's words and the
    channel is in TRANSIENT_FAILURE until it comes back, unless the bootstrap trusts the server with
    `ignore_resource_deletion`: then the last one keeps serving."""
    features = ("ignore_resource_deletion",) if "trusted" in deleted else ()
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", plane.bootstrap("channels", features))
    serve(plane, {"c1": backends[:1]})
    theirs = GrpcioClient(plane, "channels", features)
    try:
        channel = client.channel("xds:///svc")

        def ours() -> List[Any]:
            outcome = channel.unary(UNARY, b"x", timeout=10)
            state = channel.channel.get_state() if client.api == "aio" else channel.raw._router.aggregate_state()
            return [outcome.code.name, outcome.details or "", state]
        ok = ["OK", "", grpc.ChannelConnectivity.READY]
        # (each outcome waited for: a channel's state can follow a call's end by a moment, on either client)
        assert until(ours, ok.__eq__) == until(theirs.call, ok.__eq__) == ok
        if deleted == "cluster":
            plane.remove(CLUSTER, "c1")
            failed = ["UNAVAILABLE", "CDS resource c1: does not exist (node ID:channels)",
                      grpc.ChannelConnectivity.TRANSIENT_FAILURE]
        else:
            version = plane.remove(LISTENER, "svc")
            failed = ["UNAVAILABLE", "empty address list (LDS resource svc: does not exist (node ID:channels))",
                      grpc.ChannelConnectivity.TRANSIENT_FAILURE]
        if features:
            # Nothing changes to see: ours has read the removal once it answers it (grpcio 1.70 does not answer
            # it, nor what comes after it, there: its call is only seen to keep serving)
            plane.wait_answer("channels", LISTENER, version)
            assert ours() == theirs.call() == ok
            return
        assert until(theirs.call, failed.__eq__) == failed
        assert until(ours, failed.__eq__) == failed
        # Back, it serves again (grpcio 1.70 stays failing: not compared)
        plane.set(cluster() if deleted == "cluster" else listener())
        assert until(ours, ok.__eq__) == ok
    finally:
        theirs.close()


def test_routes_and_retries_as_grpcios_own_xds_client(client: Any, plane: ControlPlane,
                                                      backends: List[Backend]) -> None:
    """The same resources through grpcio's xDS client: each call reaches the same cluster, and a failing one makes
    as many attempts (the route's policy) and ends with the same code."""
    def routes(config: Any) -> None:
        host = config.virtual_hosts[0]
        host.routes.insert(0, route_components_pb2.Route(
            match=route_components_pb2.RouteMatch(prefix="", headers=[route_components_pb2.HeaderMatcher(
                name="x-user", exact_match="alice")]),
            route=route_components_pb2.RouteAction(cluster="b", retry_policy=route_retries(2))))
        host.routes[1].route.retry_policy.CopyFrom(route_retries(1))
    serve(plane, {"a": backends[:1], "b": backends[1:2]}, routes)
    calls = [[["x-user", "alice"], ["call", "1"]], [["x-user", "bob"], ["call", "2"]], [["call", "3"]],
             [["x-user", "alice"], ["call", "4"]], [["x-user", "bob"], ["call", "5"]]]

    def script() -> None:  # each route's last call fails every attempt
        backends[0].script(UNARY, Step(), Step(), fail(), fail())
        backends[1].script(UNARY, Step(), fail(), fail(), fail())

    def seen() -> Dict[str, Any]:
        where = {a.metadata["call"]: b.port for b in backends[:2] for a in b.attempts_of(UNARY)}
        attempts = collections.Counter(a.metadata["call"] for b in backends[:2] for a in b.attempts_of(UNARY))
        for backend in backends[:2]:
            backend.attempts.clear()
        return {"where": where, "attempts": dict(attempts)}
    script()
    theirs = [code for code, _ in grpcio_calls(plane, calls)]
    their_view = seen()
    script()
    channel = client.channel("xds:///svc")
    ours = [channel.unary(UNARY, b"x", timeout=10, metadata=tuple(tuple(p) for p in m)).code.name for m in calls]
    assert ours == theirs == ["OK", "OK", "OK", "UNAVAILABLE", "UNAVAILABLE"]
    assert seen() == their_view
    assert their_view["attempts"] == {"1": 1, "2": 1, "3": 1, "4": 3, "5": 2}


def test_a_cluster_drops_as_its_endpoints_ask_as_on_grpcio(client: Any, plane: ControlPlane,
                                                          backends: List[Backend]) -> None:
    def dropping(message: Any) -> None:
        assign(message, "c1", backends[:1])
        drop = message.policy.drop_overloads.add(category="throttle")
        drop.drop_percentage.numerator, drop.drop_percentage.denominator = 100, 0  # per hundred
    plane.set(cluster())
    plane.set(endpoints(dropping))
    plane.set(route_config())
    expected = ["UNAVAILABLE", "EDS-configured drop: throttle"]
    assert grpcio_calls(plane, [[]]) == [expected]
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    assert [outcome.code.name, outcome.details] == expected
    assert backends[0].attempts == []


def test_a_cluster_whose_endpoints_refuse_fails_calls_as_on_grpcio(client: Any, plane: ControlPlane) -> None:
    port = free_port(["127.0.0.1"])  # nobody listens there
    plane.set(cluster())
    plane.set(endpoints(lambda e: e.endpoints[0].lb_endpoints[0].CopyFrom(lb_endpoint("127.0.0.1", port))))
    plane.set(route_config())
    [[code, details]] = grpcio_calls(plane, [[]])
    assert details.startswith("connections to all backends failing; last error: ")
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    assert [outcome.code.name, outcome.details] == [code, details.replace("(xDS node ID:grpcio)",
                                                                          "(xDS node ID:channels)")]


@pytest.mark.parametrize("empty", ["no locality", "empty localities"])
def test_a_cluster_with_no_endpoint_fails_calls_as_on_grpcio(client: Any, plane: ControlPlane, empty: str) -> None:
    def edit(message: Any) -> None:
        if empty == "no locality":
            del message.endpoints[:]
            return
        del message.endpoints[0].lb_endpoints[:]
        message.endpoints.add().CopyFrom(message.endpoints[0])
        message.endpoints[1].locality.region, message.endpoints[1].priority = "a", 1
    plane.set(cluster())
    plane.set(endpoints(edit))
    plane.set(route_config())
    [[code, details]] = grpcio_calls(plane, [[]])
    assert details.startswith("no children in weighted_target policy")
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    assert [outcome.code.name, outcome.details] == [code, details]


def test_a_routes_max_stream_duration_bounds_the_call_as_on_grpcio(client: Any, plane: ControlPlane,
                                                                   backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1]}, lambda config: config.virtual_hosts[0].routes[0].route.max_stream_duration
          .max_stream_duration.FromMilliseconds(300))
    backends[0].fallback(UNARY, lambda i: Step(wait=10))
    (theirs,) = grpcio_calls(plane, [[]])
    started = time.monotonic()
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    assert outcome.code.name == theirs[0] == "DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 2
