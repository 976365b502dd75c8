"""Resources checked as gRPC's core checks them: grpcio's own xDS client and grpc_retry's follow the same target
(Listener -> RouteConfiguration -> Cluster -> ClusterLoadAssignment) on one control plane, and each variant of a
resource, valid or not, is ACKed or NACKed alike by both."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Iterator, List, Tuple

import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import cluster_pb2, outlier_detection_pb2  # noqa: E402
from envoy.config.core.v3 import base_pb2, config_source_pb2, health_check_pb2  # noqa: E402
from envoy.config.endpoint.v3 import endpoint_components_pb2  # noqa: E402
from envoy.config.route.v3 import route_components_pb2, route_pb2  # noqa: E402
from envoy.extensions.filters.http.fault.v3 import fault_pb2  # noqa: E402
from envoy.type.matcher.v3 import regex_pb2  # noqa: E402
from envoy.type.v3 import percent_pb2, range_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.control_plane import CLUSTER, ENDPOINTS, LISTENER, ROUTE, ControlPlane  # noqa: E402
from support.xds_resources import (  # noqa: E402
    cluster,
    endpoints,
    http_filter,
    lb_endpoint,
    listener,
    route_config,
)

from grpc_retry._backends.xds.bootstrap import parse  # noqa: E402
from grpc_retry._backends.xds.client import XdsClient  # noqa: E402
from grpc_retry._backends.xds.config import ConfigWatcher, XdsConfig  # noqa: E402


def first_route(config: Any) -> Any:
    return config.virtual_hosts[0].routes[0]


def retry(config: Any, **fields: Any) -> None:
    first_route(config).route.retry_policy.CopyFrom(route_components_pb2.RetryPolicy(retry_on="unavailable",
                                                                                     **fields))


# (name, the resource, valid)
VARIANTS: List[Tuple[str, Any, bool]] = [
    ("listener without an api listener", listener(api=False), False),
    ("listener with neither rds nor routes", listener(lambda m: m.ClearField("rds")), False),
    ("rds not over ads", listener(lambda m: m.rds.config_source.CopyFrom(
        config_source_pb2.ConfigSource(path="/x"))), False),
    ("no http filters", listener(lambda m: m.ClearField("http_filters")), False),
    ("router not last", listener(lambda m: m.http_filters.append(http_filter("fault", fault_pb2.HTTPFault()))),
     False),
    ("fault then router", listener(lambda m: m.http_filters.insert(0, http_filter("fault", fault_pb2.HTTPFault()))),
     True),
    ("an unknown filter", listener(lambda m: m.http_filters.insert(0, http_filter("x", route_pb2.Vhds()))), False),
    ("an unknown optional filter", listener(lambda m: m.http_filters.insert(0, http_filter("x", route_pb2.Vhds(),
                                                                                          True))), True),
    ("a filter whose type URL names no type", listener(lambda m: (
        m.http_filters.insert(0, http_filter("x", fault_pb2.HTTPFault())),
        setattr(m.http_filters[0].typed_config, "type_url", "no-type"))), False),
    ("two filters of one name", listener(lambda m: m.http_filters.insert(0, http_filter("router",
                                                                                       fault_pb2.HTTPFault()))),
     False),
    ("trusted hops", listener(lambda m: setattr(m, "xff_num_trusted_hops", 1)), False),
    ("a virtual host without domains", route_config(lambda r: r.virtual_hosts[0].ClearField("domains")), False),
    ("a bad domain pattern", route_config(lambda r: r.virtual_hosts[0].domains.append("a*b")), False),
    ("a route without a match", route_config(lambda r: first_route(r).ClearField("match")), False),
    ("weights all zero", route_config(lambda r: first_route(r).route.weighted_clusters.clusters.append(
        route_components_pb2.WeightedCluster.ClusterWeight(name="c1", weight=wrappers_pb2.UInt32Value(value=0)))),
     False),
    ("a weighted cluster", route_config(lambda r: first_route(r).route.weighted_clusters.clusters.append(
        route_components_pb2.WeightedCluster.ClusterWeight(name="c1", weight=wrappers_pb2.UInt32Value(value=3)))),
     True),
    ("a query parameter route", route_config(lambda r: r.virtual_hosts[0].routes.insert(
        0, route_components_pb2.Route(match=route_components_pb2.RouteMatch(
            prefix="", query_parameters=[route_components_pb2.QueryParameterMatcher(name="q")]))
    )), True),
    ("zero retries", route_config(lambda r: retry(r, num_retries=wrappers_pb2.UInt32Value(value=0))), False),
    ("a back-off without a base", route_config(lambda r: retry(r, retry_back_off=(
        route_components_pb2.RetryPolicy.RetryBackOff()))), False),
    ("a retry policy", route_config(lambda r: retry(r, num_retries=wrappers_pb2.UInt32Value(value=2))), True),
    ("a reversed header range", route_config(lambda r: first_route(r).match.headers.append(
        route_components_pb2.HeaderMatcher(name="h", range_match=range_pb2.Int64Range(start=5, end=1)))), False),
    ("a bad path regex", route_config(lambda r: first_route(r).match.CopyFrom(route_components_pb2.RouteMatch(
        safe_regex=regex_pb2.RegexMatcher(regex="(")))), False),
    ("a runtime fraction", route_config(lambda r: first_route(r).match.runtime_fraction.default_value.CopyFrom(
        percent_pb2.FractionalPercent(numerator=50))), True),
    ("a static cluster", cluster(lambda c: setattr(c, "type", cluster_pb2.Cluster.STATIC)), False),
    ("eds not over ads", cluster(lambda c: c.eds_cluster_config.eds_config.CopyFrom(
        config_source_pb2.ConfigSource(path="/x"))), False),
    ("least request", cluster(lambda c: setattr(c, "lb_policy", cluster_pb2.Cluster.LEAST_REQUEST)), False),
    ("ejection percent over 100", cluster(lambda c: c.outlier_detection.CopyFrom(
        outlier_detection_pb2.OutlierDetection(max_ejection_percent=wrappers_pb2.UInt32Value(value=150)))), False),
    ("outlier detection", cluster(lambda c: c.outlier_detection.CopyFrom(outlier_detection_pb2.OutlierDetection(
        enforcing_failure_percentage=wrappers_pb2.UInt32Value(value=100)))), True),
    ("a circuit breaker", cluster(lambda c: c.circuit_breakers.thresholds.add(
        max_requests=wrappers_pb2.UInt32Value(value=10))), True),
    ("a ring smaller than its minimum", cluster(lambda c: (
        setattr(c, "lb_policy", cluster_pb2.Cluster.RING_HASH),
        c.ring_hash_lb_config.minimum_ring_size.CopyFrom(wrappers_pb2.UInt64Value(value=100)),
        c.ring_hash_lb_config.maximum_ring_size.CopyFrom(wrappers_pb2.UInt64Value(value=10)))), False),
    ("a priority gap", endpoints(lambda e: setattr(e.endpoints[0], "priority", 1)), False),
    ("a second priority", endpoints(lambda e: e.endpoints.append(endpoint_components_pb2.LocalityLbEndpoints(
        locality=base_pb2.Locality(region="r2"), priority=1, load_balancing_weight=wrappers_pb2.UInt32Value(value=1),
        lb_endpoints=[lb_endpoint("127.0.0.2")]))), True),
    ("an endpoint of weight 0", endpoints(lambda e: e.endpoints[0].lb_endpoints[0].load_balancing_weight.CopyFrom(
        wrappers_pb2.UInt32Value(value=0))), False),
    ("a host name", endpoints(lambda e: e.endpoints[0].lb_endpoints.append(lb_endpoint("localhost"))), False),
    ("an address twice", endpoints(lambda e: e.endpoints[0].lb_endpoints.append(lb_endpoint("127.0.0.1"))), False),
    ("an unhealthy endpoint of weight 0", endpoints(lambda e: e.endpoints[0].lb_endpoints.append(lb_endpoint(
        "127.0.0.9", health_status=health_check_pb2.UNHEALTHY,
        load_balancing_weight=wrappers_pb2.UInt32Value(value=0)))), True),
    ("a locality of weight 0 with a bad endpoint", endpoints(lambda e: e.endpoints.append(
        endpoint_components_pb2.LocalityLbEndpoints(locality=base_pb2.Locality(region="r3"),
                                                    lb_endpoints=[lb_endpoint("localhost")]))), True),
    ("an unnamed drop", endpoints(lambda e: e.policy.drop_overloads.add(
        drop_percentage=percent_pb2.FractionalPercent(numerator=1))), False),
]

_GRPCIO = """
import sys, grpc
channel = grpc.insecure_channel("xds:///svc")
channel.subscribe(lambda state: None, try_to_connect=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def world() -> Iterator[Tuple[ControlPlane, List[XdsConfig]]]:
    plane = ControlPlane()
    base = [plane.set(listener()), plane.set(route_config()), plane.set(cluster()), plane.set(endpoints())]
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("grpcio"), "GRPC_VERBOSITY": "NONE"}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    process = subprocess.Popen([sys.executable, "-c", _GRPCIO], stdin=subprocess.PIPE, env=env)
    bootstrap = parse(plane.bootstrap("ours"))
    client = XdsClient(bootstrap.xds_servers[0], bootstrap.node)
    configs: List[XdsConfig] = []
    watcher = ConfigWatcher(client, bootstrap.listener_name("", "svc"), "svc", configs.append, lambda _: None)
    try:
        for node in ("grpcio", "ours"):
            for type_url, version in zip((LISTENER, ROUTE, CLUSTER, ENDPOINTS), base, strict=True):
                assert not plane.wait_answer(node, type_url, version, timeout=20).nack
        yield plane, configs
    finally:
        watcher.close()
        client.close()
        assert process.stdin is not None
        process.stdin.close()
        process.wait(10)
        plane.close()


@pytest.mark.parametrize("name, resource, valid", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_grpcio_and_grpc_retry_accept_and_reject_alike(world: Tuple[ControlPlane, List[XdsConfig]], name: str,
                                                       resource: Any, valid: bool) -> None:
    plane, _ = world
    type_url = "type.googleapis.com/" + resource.DESCRIPTOR.full_name
    version = plane.set(resource)
    try:
        theirs = plane.wait_answer("grpcio", type_url, version)
        ours = plane.wait_answer("ours", type_url, version)
        assert (ours.nack, theirs.nack) == (not valid, not valid), (ours.error, theirs.error)
    finally:  # the whole chain again, for the next variant
        base = {LISTENER: listener, ROUTE: route_config, CLUSTER: cluster, ENDPOINTS: endpoints}[type_url]()
        restored = plane.set(base)
        for node in ("grpcio", "ours"):
            plane.wait_answer(node, type_url, restored)


def test_the_whole_config_is_followed(world: Tuple[ControlPlane, List[XdsConfig]]) -> None:
    plane, configs = world
    plane.wait_for(lambda: bool(configs), what="a whole config")
    config = configs[-1]
    assert config.listener.route_config_name == "route-1" and config.route_config.name == "route-1"
    assert set(config.clusters) == {"c1"} and config.clusters["c1"].kind == "EDS"
    (priority,) = config.endpoints["c1"].priorities
    assert [e.addresses for locality in priority for e in locality.endpoints] == [("127.0.0.1:50051",)]
