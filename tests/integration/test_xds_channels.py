"""Channels on `xds:` targets, told by a real control plane (tests/support/control_plane.py) about real backends:
each call takes its route and cluster, the route's retry policy (A44) applies, and every retry stays in the
call's cluster on an endpoint the call has not used."""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Any, Callable, Dict, Iterator, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, fail  # noqa: E402
from support.clients import retry_policy, service_config  # noqa: E402
from support.control_plane import ENDPOINTS, ROUTE, ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, listener, route_config  # noqa: E402

import grpc_retry  # noqa: E402
import grpc_retry.aio  # noqa: E402


@pytest.fixture
def plane(monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    control_plane.set(listener())
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP", raising=False)
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", control_plane.bootstrap("channels"))
    yield control_plane
    control_plane.close()


def serve(plane: ControlPlane, clusters: Dict[str, List[Backend]],
          routes: Callable[[Any], Any] = lambda config: None) -> int:
    """Clusters of backends; the route config sends every call to the first cluster unless `routes` changes it.
    The route config's version."""
    for name, backends in clusters.items():
        plane.set(cluster(lambda c, n=name: setattr(c, "name", n)))
        plane.set(endpoints(lambda e, n=name, b=backends: assign(e, n, b)))
    first = next(iter(clusters))

    def edit(config: Any) -> None:
        config.virtual_hosts[0].routes[0].route.cluster = first
        routes(config)
    return plane.set(route_config(edit))


def assign(message: Any, name: str, backends: List[Backend]) -> None:
    message.cluster_name = name
    del message.endpoints[0].lb_endpoints[:]
    message.endpoints[0].lb_endpoints.extend(lb_endpoint("127.0.0.1", b.port) for b in backends)


def route_retries(num_retries: int, on: str = "unavailable") -> route_components_pb2.RetryPolicy:
    return route_components_pb2.RetryPolicy(retry_on=on, num_retries=wrappers_pb2.UInt32Value(value=num_retries))


def calls_on(backends: List[Backend]) -> List[int]:
    return [len(b.attempts_of(UNARY)) for b in backends]


def test_calls_spread_over_the_clusters_endpoints(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    serve(plane, {"c1": backends})
    channel = client.channel("xds:///svc")
    for _ in range(30):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert all(count >= 5 for count in calls_on(backends)), calls_on(backends)


def test_the_routes_retry_policy_sends_each_retry_to_a_fresh_endpoint(client: Any, plane: ControlPlane,
                                                                     backends: List[Backend]) -> None:
    """Two of three endpoints fail every attempt: with the route's three attempts every call succeeds, and no
    call sends two attempts to one endpoint."""
    serve(plane, {"c1": backends},
          lambda config: config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(route_retries(2)))
    for backend in backends[:2]:
        backend.fallback(UNARY, lambda i: fail())
    channel = client.channel("xds:///svc")
    for i in range(20):
        outcome = channel.unary(UNARY, b"x", timeout=10, metadata=(("call", str(i)),))
        assert outcome.code == grpc.StatusCode.OK, outcome
    per_call = collections.Counter((b.port, a.metadata["call"]) for b in backends for a in b.attempts_of(UNARY))
    assert max(per_call.values()) == 1
    assert len(backends[2].attempts_of(UNARY)) == 20


def test_without_a_route_policy_the_channels_service_config_applies(client: Any, plane: ControlPlane,
                                                                   backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1]})
    backends[0].script(UNARY, fail(), fail())
    options = [("grpc.service_config", service_config(retry_policy(max_attempts=3)))]
    assert client.channel("xds:///svc", options).unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert len(backends[0].attempts_of(UNARY)) == 3
    # A route's policy replaces it whole: retry_on names no code gRPC retries, so no retries.
    version = serve(plane, {"c1": backends[:1]}, lambda config: config.virtual_hosts[0].routes[0].route.retry_policy
                    .CopyFrom(route_retries(2, "5xx")))
    plane.wait_answer("channels", ROUTE, version)
    channel = client.channel("xds:///svc", options)
    backends[0].script(UNARY, fail())
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.UNAVAILABLE


def test_weighted_clusters_share_calls_by_weight(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    def weighted(config: Any) -> None:
        action = config.virtual_hosts[0].routes[0].route
        action.weighted_clusters.clusters.extend([
            route_components_pb2.WeightedCluster.ClusterWeight(name="a", weight=wrappers_pb2.UInt32Value(value=80)),
            route_components_pb2.WeightedCluster.ClusterWeight(name="b", weight=wrappers_pb2.UInt32Value(value=20))])
    serve(plane, {"a": backends[:1], "b": backends[1:2]}, weighted)
    channel = client.channel("xds:///svc")
    for _ in range(400):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    share = len(backends[0].attempts_of(UNARY)) / 400
    assert 0.72 <= share <= 0.88, share


def test_a_header_chooses_the_route(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    def by_header(config: Any) -> None:
        host = config.virtual_hosts[0]
        special = route_components_pb2.Route(
            match=route_components_pb2.RouteMatch(prefix="", headers=[route_components_pb2.HeaderMatcher(
                name="x-user", exact_match="alice")]),
            route=route_components_pb2.RouteAction(cluster="b"))
        host.routes.insert(0, special)
    serve(plane, {"a": backends[:1], "b": backends[1:2]}, by_header)
    channel = client.channel("xds:///svc")
    for user in ("alice", "bob", "alice"):
        assert channel.unary(UNARY, b"x", timeout=10, metadata=(("x-user", user),)).code == grpc.StatusCode.OK
    assert calls_on(backends[:2]) == [1, 2]


def test_a_call_no_route_takes_fails_unavailable(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1]},
          lambda config: config.virtual_hosts[0].routes[0].match.CopyFrom(route_components_pb2.RouteMatch(
              prefix="/other.Service/")))
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    assert (outcome.code, outcome.details) == (grpc.StatusCode.UNAVAILABLE,
                                               "No matching route found in xDS route config")


def test_new_calls_follow_the_endpoints(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1]})
    channel = client.channel("xds:///svc")
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    version = plane.set(endpoints(lambda e: assign(e, "c1", backends[1:2])))
    plane.wait_answer("channels", ENDPOINTS, version)
    for _ in range(10):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert calls_on(backends[:2]) == [1, 10]


@pytest.mark.parametrize("make", [grpc_retry.insecure_channel, grpc_retry.aio.insecure_channel])
def test_a_missing_bootstrap_raises_at_creation(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP", raising=False)
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP_CONFIG", raising=False)
    with pytest.raises(ValueError, match="GRPC_XDS_BOOTSTRAP"):
        make("xds:///svc")


@pytest.mark.parametrize("kind, method, payload", [
    ("unary", UNARY, b"x"), ("server_stream", SERVER_STREAM, b"x"), ("client_stream", CLIENT_STREAM, [b"a", b"b"]),
    ("bidi", BIDI, [b"a", b"b"])])
def test_a_call_made_before_the_first_config_waits_for_it(client: Any, plane: ControlPlane, backends: List[Backend],
                                                          kind: str, method: str, payload: Any) -> None:
    channel = client.channel("xds:///svc")  # (the control plane has no route config yet)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(channel.invoke, kind, channel.multicallable(kind, method), payload, timeout=10)
        plane.wait_for(lambda: plane.streams() == 1, what="the channel's ADS stream")
        assert not pending.done(), pending.exception()
        serve(plane, {"c1": backends[:1]})
        assert pending.result(10).code == grpc.StatusCode.OK
    assert len(backends[0].attempts_of(method)) == 1


def test_a_config_that_never_comes_ends_the_call_at_its_deadline(client: Any, plane: ControlPlane) -> None:
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=0.3)
    assert outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_calls_fail_over_to_the_next_priority_while_every_endpoint_of_the_first_fails(
        client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    """(The route's retries cover a call made while the first priority is being found unreachable.)"""
    down = Backend()
    down.stop()  # its port refuses connections

    def two_priorities(message: Any) -> None:
        assign(message, "c1", [down])
        second = message.endpoints.add()
        second.CopyFrom(message.endpoints[0])
        second.locality.zone, second.priority = "z2", 1
        del second.lb_endpoints[:]
        second.lb_endpoints.append(lb_endpoint("127.0.0.1", backends[0].port))
    plane.set(cluster())
    plane.set(endpoints(two_priorities))
    plane.set(route_config(
        lambda config: config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(route_retries(2))))
    channel = client.channel("xds:///svc")
    for _ in range(5):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert len(backends[0].attempts_of(UNARY)) == 5
