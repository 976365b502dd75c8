"""A call's route, chosen as gRPC chooses it (gRFC A28, A31) from a decoded RouteConfiguration, and its retry
policy as a service config's (gRFC A44)."""

from __future__ import annotations

import collections
import random
from typing import Any, List

import pytest

pytest.importorskip("envoy")

from envoy.config.route.v3 import route_components_pb2 as rc  # noqa: E402
from envoy.config.route.v3 import route_pb2  # noqa: E402
from envoy.type.matcher.v3 import string_pb2  # noqa: E402
from google.protobuf import duration_pb2, wrappers_pb2  # noqa: E402

from grpc_retry._backends.xds import routes  # noqa: E402


def route(cluster: str, **match: Any) -> rc.Route:
    return rc.Route(match=rc.RouteMatch(**match), route=rc.RouteAction(cluster=cluster))


def decoded(*hosts: rc.VirtualHost) -> routes.RouteConfiguration:
    return routes.decode(route_pb2.RouteConfiguration(name="r", virtual_hosts=hosts).SerializeToString())[1]


@pytest.mark.parametrize("authority, chosen", [
    ("api.example.com", "exact"), ("API.Example.com", "exact"), ("x.example.com", "suffix"),
    ("api.example.org", "prefix"), ("other", "any"), ("longer.b.example.com", "longer suffix"),
])
def test_the_most_specific_domain_wins(authority: str, chosen: str) -> None:
    config = decoded(rc.VirtualHost(name="any", domains=["*"]),
                     rc.VirtualHost(name="prefix", domains=["api.example.*"]),
                     rc.VirtualHost(name="suffix", domains=["*.example.com"]),
                     rc.VirtualHost(name="longer suffix", domains=["*.b.example.com"]),
                     rc.VirtualHost(name="exact", domains=["api.example.com"]))
    host = config.virtual_host(authority)
    names = {"*": "any", "api.example.*": "prefix", "*.example.com": "suffix", "*.b.example.com": "longer suffix",
             "api.example.com": "exact"}
    assert host is not None and names[host.domains[0]] == chosen


def test_no_virtual_host_for_a_name_nothing_matches() -> None:
    assert decoded(rc.VirtualHost(name="v", domains=["a.example.com"])).virtual_host("b.example.com") is None


def test_the_first_matching_route_wins() -> None:
    host = decoded(rc.VirtualHost(name="v", domains=["*"], routes=[
        route("by-header", prefix="/", headers=[rc.HeaderMatcher(name="tier", exact_match="gold")]),
        route("by-method", path="/pkg.Svc/Get"),
        route("by-service", prefix="/pkg.svc/", case_sensitive=wrappers_pb2.BoolValue(value=False)),
        route("by-regex", safe_regex={"regex": "/other\\..*"}),
        route("absent", prefix="", headers=[rc.HeaderMatcher(name="x-canary", present_match=False)]),
        route("rest", prefix=""),
    ])).virtual_host("svc")
    assert host is not None

    def chosen(path: str, **metadata: str) -> str:
        found = host.route(path, metadata)
        assert found is not None
        return found.clusters[0][0]

    assert chosen("/pkg.Svc/Get", tier="gold") == "by-header"
    assert chosen("/pkg.Svc/Get") == "by-method"
    assert chosen("/PKG.SVC/Put") == "by-service"
    assert chosen("/other.Svc/Put") == "by-regex"
    assert chosen("/x.Y/Z") == "absent"
    assert chosen("/x.Y/Z", **{"x-canary": "1"}) == "rest"


def test_routes_no_grpc_call_can_take_are_left_out() -> None:
    host = decoded(rc.VirtualHost(name="v", domains=["*"], routes=[
        route("query", prefix="", query_parameters=[rc.QueryParameterMatcher(name="q")]),
        route("not a path", prefix="pkg"),
        route("three slashes", prefix="/a/b/c"),
        route("not service/method", path="/only"),
        rc.Route(match=rc.RouteMatch(prefix=""), route=rc.RouteAction(cluster_header="x-cluster")),
        route("kept", prefix=""),
    ])).virtual_host("svc")
    assert host is not None and [r.clusters for r in host.routes] == [(("kept", 1),)]


def test_a_weighted_cluster_is_chosen_by_weight() -> None:
    action = rc.RouteAction(weighted_clusters=rc.WeightedCluster(clusters=[
        rc.WeightedCluster.ClusterWeight(name="a", weight=wrappers_pb2.UInt32Value(value=80)),
        rc.WeightedCluster.ClusterWeight(name="b", weight=wrappers_pb2.UInt32Value(value=20)),
        rc.WeightedCluster.ClusterWeight(name="zero", weight=wrappers_pb2.UInt32Value(value=0))]))
    host = decoded(rc.VirtualHost(name="v", domains=["*"], routes=[rc.Route(match=rc.RouteMatch(prefix=""),
                                                                            route=action)])).virtual_host("svc")
    assert host is not None and host.cluster_names() == {"a", "b"}
    rng = random.Random(7)
    counts = collections.Counter(host.routes[0].pick_cluster(rng.randrange) for _ in range(10000))
    assert set(counts) == {"a", "b"} and 0.77 < counts["a"] / 10000 < 0.83


def policies(route_policy: Any = None, host_policy: Any = None) -> List[Any]:
    first = route("c", prefix="")
    if route_policy is not None:
        first.route.retry_policy.CopyFrom(route_policy)
    host = rc.VirtualHost(name="v", domains=["*"], routes=[first])
    if host_policy is not None:
        host.retry_policy.CopyFrom(host_policy)
    found = decoded(host).virtual_host("svc")
    assert found is not None
    policy = found.retry_policy_of(found.routes[0])
    return [policy, None if policy is None else policy.retry_policy(5)]


def test_a_route_retry_policy_as_a_service_config_one() -> None:
    _, mapped = policies(rc.RetryPolicy(retry_on="unavailable,cancelled,5xx,gateway-error",
                                        num_retries=wrappers_pb2.UInt32Value(value=2)))
    assert mapped.retryable_status_codes == frozenset({14, 1})
    assert (mapped.max_attempts, mapped.initial_backoff, mapped.max_backoff, mapped.backoff_multiplier) == (
        3, 0.025, 0.25, 2.0)
    _, capped = policies(rc.RetryPolicy(retry_on="internal", num_retries=wrappers_pb2.UInt32Value(value=9),
                                        retry_back_off=rc.RetryPolicy.RetryBackOff(
                                            base_interval=duration_pb2.Duration(nanos=100_000_000))))
    assert (capped.max_attempts, capped.initial_backoff, capped.max_backoff) == (5, 0.1, 1.0)


def test_a_route_policy_replaces_the_virtual_hosts_whole() -> None:
    host = rc.RetryPolicy(retry_on="unavailable")
    assert policies(None, host)[1].retryable_status_codes == frozenset({14})
    policy, mapped = policies(rc.RetryPolicy(retry_on="5xx"), host)  # no code gRPC retries: no retries at all
    assert policy is not None and mapped is None
    assert policies() == [None, None]


def test_a_zero_backoff_cannot_be_used() -> None:
    zero = routes.RetryPolicy(frozenset({"unavailable"}), 2, 0.0, 0.0)
    with pytest.raises(ValueError, match="greater than 0"):
        zero.retry_policy(5)


def test_an_inverted_header_matcher_and_a_string_matcher() -> None:
    host = decoded(rc.VirtualHost(name="v", domains=["*"], routes=[
        route("not-gold", prefix="", headers=[rc.HeaderMatcher(name="tier", exact_match="gold", invert_match=True)]),
        route("folded", prefix="", headers=[rc.HeaderMatcher(name="env", string_match=string_pb2.StringMatcher(
            prefix="PRO", ignore_case=True))]),
        route("rest", prefix=""),
    ])).virtual_host("svc")
    assert host is not None
    assert host.route("/a.B/C", {"tier": "silver"}).clusters[0][0] == "not-gold"  # type: ignore[union-attr]
    assert host.route("/a.B/C", {"tier": "gold", "env": "production"}).clusters[0][0] == "folded"  # type: ignore
    assert host.route("/a.B/C", {"tier": "gold"}).clusters[0][0] == "rest"  # type: ignore[union-attr]
    assert host.route("/a.B/C", {}).clusters[0][0] == "rest"  # type: ignore[union-attr]  (absent: even inverted, no)
