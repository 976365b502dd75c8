"""Channels on `xds:` targets, told by a real control plane (tests/support/control_plane.py) about real backends:
each call takes its route and cluster, the route's retry policy (A44) applies, and every retry stays in the
call's cluster on an endpoint the call has not used."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import gc
import json
import logging
import threading
import time
from typing import Any, Callable, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import outlier_detection_pb2  # noqa: E402
from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (  # noqa: E402
    client_side_weighted_round_robin_pb2 as wrr_pb2,
)
from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.backend import SERVER_STREAM, UNARY, Backend, Step, fail  # noqa: E402
from support.clients import retry_policy, service_config  # noqa: E402
from support.control_plane import CLUSTER, ENDPOINTS, ROUTE, ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, route_config  # noqa: E402
from support.xds_scenario import assign, calls_on, route_retries, serve, until  # noqa: E402

import grpc_retry  # noqa: E402
import grpc_retry.aio  # noqa: E402


def test_calls_spread_over_the_clusters_endpoints(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    serve(plane, {"c1": backends})
    channel = client.channel("xds:///svc")

    def served() -> List[int]:
        for _ in range(6):
            assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
        return calls_on(backends)
    # (round_robin spreads over the endpoints that are ready: one may still be connecting as the first calls go)
    spread = until(served, lambda counts: all(count >= 5 for count in counts))
    assert all(count >= 5 for count in spread), spread


def test_the_routes_retry_policy_sends_each_retry_to_a_fresh_endpoint(client: Any, plane: ControlPlane,
                                                                     backends: List[Backend]) -> None:
    """Two of three endpoints fail every attempt: with the route's three attempts every call succeeds, 16 in
    flight, and no call sends two attempts to one endpoint."""
    serve(plane, {"c1": backends},
          lambda config: config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(route_retries(2)))
    for backend in backends[:2]:
        backend.fallback(UNARY, lambda i: fail())
    channel = client.channel("xds:///svc")
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(lambda i: channel.unary(UNARY, b"x", timeout=10, metadata=(("call", str(i)),)),
                                 range(64)))
    assert [o.code for o in outcomes] == [grpc.StatusCode.OK] * 64
    per_call = collections.Counter((b.port, a.metadata["call"]) for b in backends for a in b.attempts_of(UNARY))
    assert max(per_call.values()) == 1
    assert len(backends[2].attempts_of(UNARY)) == 64


def test_a_route_policy_naming_no_code_grpc_retries_overrides_the_virtual_hosts(
        client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    def policies(config: Any) -> None:
        config.virtual_hosts[0].retry_policy.CopyFrom(route_retries(2))
        config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(route_retries(2, "5xx"))
    serve(plane, {"c1": backends[:1]}, policies)
    backends[0].script(UNARY, fail())
    assert client.channel("xds:///svc").unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.UNAVAILABLE
    assert len(backends[0].attempts_of(UNARY)) == 1


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


@pytest.mark.slow  # (a timed scenario with servers: run on 3.11 only, tox.ini)
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


@pytest.mark.slow  # (a timed scenario with servers: run on 3.11 only, tox.ini)
def test_endpoints_added_and_removed_under_load(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    """8 calls in flight all along: no call fails; an added endpoint takes calls; a removed one gets no new call
    3 s after its removal was sent."""
    serve(plane, {"c1": backends[:2]})
    channel = client.channel("xds:///svc")
    outcomes: List[Any] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            outcomes.append(channel.unary(UNARY, b"x", timeout=10))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        workers = [pool.submit(load) for _ in range(8)]
        backends[1].wait_for(lambda: len(backends[1].attempts) >= 20, what="calls on the first endpoints")
        plane.set(endpoints(lambda e: assign(e, "c1", backends)))
        backends[2].wait_for(lambda: len(backends[2].attempts) >= 20, what="calls on the added endpoint")
        removed = time.monotonic()
        plane.set(endpoints(lambda e: assign(e, "c1", backends[1:])))
        backends[2].wait_for(lambda: any(a.arrived > removed + 3.5 for a in backends[2].attempts), timeout=20,
                             what="load past the removal's 3 s")
        stop.set()
        for worker in workers:
            worker.result(30)
    assert outcomes and {o.code for o in outcomes} == {grpc.StatusCode.OK}
    assert max(a.arrived for a in backends[0].attempts) < removed + 3


def test_a_clusters_circuit_breaker_caps_its_calls_in_flight(client: Any, plane: ControlPlane,
                                                            backends: List[Backend]) -> None:
    def one_at_a_time(message: Any) -> None:
        message.circuit_breakers.thresholds.add().max_requests.value = 1
    release = threading.Event()
    serve(plane, {"c1": backends[:1]})
    plane.set(cluster(one_at_a_time))  # (before the channel's client asks: its first answer)
    backends[0].script(UNARY, Step(gate=release))
    channel = client.channel("xds:///svc")
    held = channel.start_call("unary", UNARY, b"x", timeout=10)
    backends[0].wait_attempts(UNARY, 1)
    outcome = channel.unary(UNARY, b"x", timeout=10)
    assert [outcome.code, outcome.details] == [grpc.StatusCode.UNAVAILABLE, "circuit breaker drop"]
    release.set()
    assert held.result(10).code == grpc.StatusCode.OK
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK  # its place freed with its end


def test_the_service_configs_per_attempt_timeout_and_hedging_apply_where_the_route_gives_no_policy(
        client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:2]})
    backends[0].fallback(UNARY, lambda i: Step(wait=10))  # accepts calls, never answers
    timed = dict(retry_policy(max_attempts=3), perAttemptRecvTimeout="0.2s")
    channel = client.channel("xds:///svc", [("grpc.service_config", service_config(timed))])
    for _ in range(6):
        started = time.monotonic()
        assert channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK
        assert time.monotonic() - started < 2
    hedged = json.dumps({"methodConfig": [{"name": [{"service": "grpc_retry.test.Echo"}], "hedgingPolicy": {
        "maxAttempts": 2, "hedgingDelay": "0.1s"}}]})
    channel = client.channel("xds:///svc", [("grpc.service_config", hedged)])
    for _ in range(6):
        started = time.monotonic()
        assert channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK
        assert time.monotonic() - started < 2
    assert len(backends[1].attempts_of(UNARY)) == 12


def test_a_cluster_changed_gets_subchannels_made_for_it(client: Any, plane: ControlPlane,
                                                        backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:2]})
    channel = client.channel("xds:///svc")
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    router = channel.raw._router
    (before,) = router.subchannels()
    assert before.outliers is None
    version = plane.set(cluster(lambda c: c.outlier_detection.CopyFrom(outlier_detection_pb2.OutlierDetection())))
    plane.wait_answer("channels", CLUSTER, version)
    plane.wait_for(lambda: router.subchannels() != [before], what="the channel's new subchannels")
    (after,) = router.subchannels()
    assert after.outliers is not None and before.live_addresses == []
    for _ in range(4):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK


def test_the_channel_becomes_ready_with_its_clusters(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    """try_to_connect before any config: the channel connects each cluster's subchannels as they come, and is
    READY once one is (as grpcio's channel_ready)."""
    channel = client.channel("xds:///svc")
    if client.api == "aio":
        async def ready() -> Any:
            waiting = asyncio.ensure_future(channel.channel.channel_ready())
            await asyncio.sleep(0)
            serve(plane, {"c1": backends[:1]})
            await asyncio.wait_for(waiting, 10)
            return channel.channel.get_state()
        assert channel.run(ready(), 20) == grpc.ChannelConnectivity.READY
        return
    states: List[Any] = []
    ready = threading.Event()

    def callback(state: Any) -> None:
        states.append(state)
        if state == grpc.ChannelConnectivity.READY:
            ready.set()
    channel.channel.subscribe(callback, try_to_connect=True)
    try:
        serve(plane, {"c1": backends[:1]})
        assert ready.wait(10), states
    finally:
        channel.channel.unsubscribe(callback)
    assert backends[0].attempts == []  # connected, no call made
    assert grpc.channel_ready_future(channel.channel).result(timeout=10) is None


@pytest.mark.slow  # (a timed scenario with servers: run on 3.11 only, tox.ini)
def test_localities_and_endpoints_share_calls_by_weight(client: Any, plane: ControlPlane,
                                                       backends: List[Backend]) -> None:
    """Localities of weights 3 and 1, of one endpoint and of two of weights 1 and 3: 75% of the calls to the
    first, then 6.25% and 18.75% (±8 points over 400 calls)."""
    def localities(message: Any) -> None:
        assign(message, "c1", backends[:1])
        message.endpoints[0].load_balancing_weight.value = 3
        second = message.endpoints.add()
        second.CopyFrom(message.endpoints[0])
        second.locality.zone, second.load_balancing_weight.value = "z2", 1
        del second.lb_endpoints[:]
        second.lb_endpoints.extend(lb_endpoint("127.0.0.1", b.port) for b in backends[1:])
        second.lb_endpoints[1].load_balancing_weight.value = 3
    plane.set(cluster())
    plane.set(endpoints(localities))
    plane.set(route_config())
    channel = client.channel("xds:///svc")
    for _ in range(400):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    shares = [len(b.attempts_of(UNARY)) / 400 for b in backends]
    assert [round(share * 100) for share in shares] == pytest.approx([75, 6.25, 18.75], abs=8), shares


def test_a_route_policy_with_a_zero_back_off_fails_its_calls(client: Any, plane: ControlPlane,
                                                             backends: List[Backend]) -> None:
    def zero(config: Any) -> None:
        policy = route_retries(2)
        policy.retry_back_off.base_interval.FromMilliseconds(0)
        config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(policy)
    serve(plane, {"c1": backends[:1]}, zero)
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=10)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE and "retry_back_off" in (outcome.details or "")
    assert backends[0].attempts == []


@pytest.mark.slow  # (a timed scenario with servers: run on 3.11 only, tox.ini)
def test_new_weights_for_the_same_endpoints_apply(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    def localities(first: int) -> Callable[[Any], None]:
        def edit(message: Any) -> None:
            assign(message, "c1", backends[:1])
            message.endpoints[0].load_balancing_weight.value = first
            second = message.endpoints.add()
            second.CopyFrom(message.endpoints[0])
            second.locality.zone, second.load_balancing_weight.value = "z2", 1
            second.lb_endpoints[0].CopyFrom(lb_endpoint("127.0.0.1", backends[1].port))
        return edit
    plane.set(cluster())
    plane.set(endpoints(localities(1)))
    plane.set(route_config())
    channel = client.channel("xds:///svc")
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    plane.wait_answer("channels", ENDPOINTS, plane.set(endpoints(localities(3))))
    before = calls_on(backends[:2])
    for _ in range(400):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    share = (calls_on(backends[:2])[0] - before[0]) / 400
    assert 0.67 <= share <= 0.83, share


def test_a_sync_stream_no_route_takes_raises_as_it_is_read(plane: ControlPlane, backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1]}, lambda config: config.virtual_hosts[0].routes[0].match.CopyFrom(
        route_components_pb2.RouteMatch(prefix="/other.Service/")))
    with grpc_retry.insecure_channel("xds:///svc") as channel:
        with pytest.raises(grpc.RpcError) as ended:
            list(channel.unary_stream(SERVER_STREAM)(b"x", timeout=10))
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE


def open_grpcio_channels() -> int:
    """The process's grpcio channels not closed yet (subchannels, the xDS client's and any other test's)."""
    gc.collect()
    count = 0
    for thing in gc.get_objects():
        if isinstance(thing, grpc.aio._channel.Channel):
            count += not thing._channel.closed()
        elif isinstance(thing, grpc._channel.Channel):
            try:
                thing._channel.check_connectivity_state(False)
            except ValueError:  # closed
                continue
            count += 1
    return count


def settle(predicate: Callable[[], bool], timeout: float = 10.0, pause: float = 0.01) -> bool:
    """Whether `predicate` holds within `timeout` (polled: a cluster closes on the thread that ended its last
    call, or on the channel's loop, a moment after that call's end is seen)."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(pause)
    return predicate()


def grpcio_channels_settle(most: int) -> bool:
    """Whether at most `most` grpcio channels are open within a few seconds (a subchannel closes aside; each count
    walks the heap, holding the GIL, so it is made rarely)."""
    return settle(lambda: open_grpcio_channels() <= most, pause=0.2)


def test_a_cluster_and_a_routes_policy_changed_again_and_again_leave_the_channel_its_size(
        client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    """A control plane changes the Cluster (its outlier detection: new subchannels for it) and the route's retry
    policy 50 times, a call after each change: the channel holds one cluster, one policy and one method of it,
    and no more grpcio channels than at the start; a call in flight on the first cluster all along ends OK, and
    that cluster's subchannels close once it has."""
    def policy(i: int) -> Callable[[Any], None]:
        def edit(config: Any) -> None:
            retries = route_retries(1)
            retries.retry_back_off.base_interval.FromMilliseconds(10 + i)
            config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(retries)
        return edit
    serve(plane, {"c1": backends[:1]}, policy(0))
    channel = client.channel("xds:///svc")
    unary = channel.multicallable("unary", UNARY)  # (one method all along: its own table of clusters)
    assert channel.invoke("unary", unary, b"x", timeout=10).code == grpc.StatusCode.OK
    router = channel.raw._router
    (first,) = router.subchannels()
    release = threading.Event()
    backends[0].script(UNARY, Step(gate=release))
    held = channel.start("unary", unary, b"held", timeout=30)
    backends[0].wait_attempts(UNARY, 2)
    try:
        opened = open_grpcio_channels()
        for i in range(1, 51):
            (before,) = router.subchannels()
            plane.set(cluster(lambda c, i=i: c.outlier_detection.interval.FromMilliseconds(10_000 + i)))
            plane.set(route_config(policy(i)))
            assert settle(lambda before=before, i=i: router.subchannels() != [before] and router._config
                          .virtual_host.routes[0].retry_policy.initial_backoff == (10 + i) / 1000), i
            assert channel.invoke("unary", unary, b"x", timeout=10).code == grpc.StatusCode.OK
        assert not held.done()
        held_now = [router._clusters, router._policies, unary._methods, channel.raw._state.routes]
        assert [len(table) for table in held_now] == [1, 1, 1, 1]
        assert settle(lambda: [entry.subchannels for entry in router._retired] == [first])  # (the others: closed)
        assert grpcio_channels_settle(opened + 1)  # (the cluster of today and the one of the call in flight)
        assert not first.closed
    finally:
        release.set()
    assert held.result(10).code == grpc.StatusCode.OK
    assert settle(lambda: first.closed and router._retired == [])
    assert grpcio_channels_settle(opened)


def test_clusters_the_routes_no_longer_name_close_and_leave_the_channel_its_size(
        client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    """The route names another cluster 30 times, a call after each change: the channel holds the one cluster its
    routes name, each one before it closes once its last call has ended (a call in flight on the first all
    along ends OK), and no more grpcio channels stay open than at the start."""
    serve(plane, {"c0": backends[:1]})
    channel = client.channel("xds:///svc")
    unary = channel.multicallable("unary", UNARY)
    assert channel.invoke("unary", unary, b"x", timeout=10).code == grpc.StatusCode.OK
    router = channel.raw._router
    (first,) = router.subchannels()
    release = threading.Event()
    backends[0].script(UNARY, Step(gate=release))
    held = channel.start("unary", unary, b"held", timeout=30)
    backends[0].wait_attempts(UNARY, 2)
    try:
        opened = open_grpcio_channels()
        for i in range(1, 31):
            serve(plane, {f"c{i}": backends[:1]})
            assert settle(lambda i=i: list(router._clusters) == [f"c{i}"]), (i, list(router._clusters))
            assert channel.invoke("unary", unary, b"x", timeout=10).code == grpc.StatusCode.OK
        assert not held.done()
        assert [len(table) for table in (router._clusters, unary._methods)] == [1, 1]
        assert settle(lambda: [entry.subchannels for entry in router._retired] == [first])  # (the others: closed)
        assert grpcio_channels_settle(opened + 1)  # (the cluster of today and the one of the call in flight)
    finally:
        release.set()
    assert held.result(10).code == grpc.StatusCode.OK
    assert settle(lambda: first.closed and router._retired == [])
    assert grpcio_channels_settle(opened)


def test_a_call_routed_to_a_cluster_as_it_is_retired_goes_to_its_successor(plane: ControlPlane,
                                                                           backends: List[Backend]) -> None:
    """(Sync: the config is applied on the xDS client's thread while calls route on theirs.) A call routed to a
    cluster that is retired before it enters is not let in: it routes again, to the cluster that replaced it, and
    the one retired, with no call in it, closes."""
    serve(plane, {"c1": backends[:1]})
    with grpc_retry.insecure_channel("xds:///svc") as channel:
        unary = channel.unary_unary(UNARY)
        assert unary(b"x", timeout=10) == b"x"
        router = channel._router
        routed = router.route(UNARY, None)  # (where a call is between its route and its admission)
        plane.set(cluster(lambda c: c.outlier_detection.CopyFrom(outlier_detection_pb2.OutlierDetection())))
        assert settle(lambda: router.subchannels() != [routed[0]])
        assert unary.method_of(routed) is None
        method, admission, _ = unary.admitted(None, False)
        assert admission is router._clusters["c1"].admission and admission is not routed[2]
        admission.release()
        assert settle(lambda: routed[0].closed)
        assert unary(b"y", timeout=10) == b"y"


class _Warnings(logging.Handler):
    """The `grpc_retry` logger's warnings, waited for as they come."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: List[str] = []
        self._told = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._told:
            self.messages.append(record.getMessage())
            self._told.notify_all()

    def wait_for(self, count: int) -> List[str]:
        with self._told:
            self._told.wait_for(lambda: len(self.messages) >= count, 10)
            return list(self.messages)


def test_a_cluster_whose_lb_policy_round_robin_serves_is_told_of_once(
        client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    """A cluster asking for a policy grpc_retry does not have (weighted_round_robin, then pick_first, by
    load_balancing_policy) is served by round_robin, said once per policy asked for in a WARNING naming the cluster;
    a config that changes the cluster otherwise says nothing again, nor does one back on round_robin."""
    def weighted(message: Any) -> None:
        message.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(
            wrr_pb2.ClientSideWeightedRoundRobin())

    warnings = _Warnings()
    logger = logging.getLogger("grpc_retry")
    logger.addHandler(warnings)
    try:
        serve(plane, {"c1": backends[:2]})
        plane.set(cluster(weighted))
        channel = client.channel("xds:///svc")

        def served() -> List[int]:
            assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
            return calls_on(backends)
        # (round_robin spreads over the endpoints that are ready: the second may still be connecting at first)
        spread = until(served, lambda counts: all(count > 0 for count in counts[:2]))
        assert all(count > 0 for count in spread[:2]), spread
        (told,) = warnings.wait_for(1)
        assert "'c1'" in told and "weighted_round_robin" in told and "round_robin serves it" in told
        router = channel.raw._router
        applied = router.generation
        plane.set(cluster(lambda c: (weighted(c), c.circuit_breakers.thresholds.add().max_requests.CopyFrom(
            wrappers_pb2.UInt32Value(value=100)))))
        assert settle(lambda: router.generation > applied)  # (no event tells a config was applied: polled)
        assert router._clusters["c1"].admission.breaker.max_requests == 100
        assert warnings.messages == [told]

        def pick_first(message: Any) -> None:
            message.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(
                pick_first_pb2.PickFirst())
        plane.set(cluster(pick_first))
        again = warnings.wait_for(2)
        assert len(again) == 2 and "'c1'" in again[1] and "pick_first" in again[1]
        applied = router.generation
        plane.set(cluster())  # (ROUND_ROBIN: served as asked)
        assert settle(lambda: router.generation > applied)
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
        assert warnings.messages == again
    finally:
        logger.removeHandler(warnings)
