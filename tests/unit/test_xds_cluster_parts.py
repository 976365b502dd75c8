"""The parts of an xDS cluster that decide alone, each driven here without a channel: its drops, its circuit breaker
(and the admission that puts them together), its localities' shares, its priorities' failover and the notice of an
LB policy that round_robin serves."""

from __future__ import annotations

import itertools
import logging
from typing import Dict, List

import pytest

pytest.importorskip("envoy")

from grpc_retry._backends.xds.circuit_breaker import CircuitBreaker  # noqa: E402
from grpc_retry._backends.xds.cluster_impl import ClusterImpl  # noqa: E402
from grpc_retry._backends.xds.drops import Drops  # noqa: E402
from grpc_retry._backends.xds.endpoints import ClusterLoadAssignment, Endpoint, Locality  # noqa: E402
from grpc_retry._backends.xds.errors import RouteError  # noqa: E402
from grpc_retry._backends.xds.lb_policy import Replacements, in_force  # noqa: E402
from grpc_retry._backends.xds.localities import empty, shares  # noqa: E402
from grpc_retry._backends.xds.priorities import priorities, serving  # noqa: E402


def test_the_breaker_lets_in_max_requests_calls_and_fails_the_next_until_one_ends() -> None:
    breaker = CircuitBreaker()
    breaker.max_requests = 2
    assert breaker.admit() and breaker.admit()
    with pytest.raises(RouteError, match="^circuit breaker drop$"):
        breaker.admit()
    breaker.release()
    assert breaker.admit() and breaker.inflight == 2


def test_a_retired_breaker_lets_no_call_in_and_tells_once_when_its_last_has_ended() -> None:
    breaker = CircuitBreaker()
    told: List[str] = []
    assert breaker.admit() and breaker.admit()
    breaker.retire(lambda: told.append("drained"))
    assert breaker.admit() is False
    breaker.release()
    assert told == []
    breaker.release()
    assert told == ["drained"]
    idle = CircuitBreaker()
    idle.retire(lambda: told.append("at once"))
    assert told == ["drained", "at once"]


def test_each_drop_category_drops_its_share_of_the_draws() -> None:
    draws = iter([0.05, 0.5, 0.15, 0.5])
    drops = Drops(lambda: next(draws))
    drops.categories = (("lb", 100_000), ("throttle", 200_000))  # 10 %, then 20 % of what the first lets through
    with pytest.raises(RouteError, match="^EDS-configured drop: lb$"):
        drops.check()  # 0.05 < 10 %
    with pytest.raises(RouteError, match="^EDS-configured drop: throttle$"):
        drops.check()  # 0.5 lets it past lb; 0.15 < 20 %
    drops.categories = ()
    drops.check()  # (no category: no draw)
    assert next(draws) == 0.5


def test_admission_drops_before_the_breaker_counts_and_a_retired_cluster_neither_drops_nor_counts() -> None:
    admission = ClusterImpl(draw=itertools.cycle([0.0, 0.9]).__next__)
    admission.drops.categories = (("lb", 500_000),)
    with pytest.raises(RouteError):
        admission.admit()
    assert admission.breaker.inflight == 0
    assert admission.admit() and admission.breaker.inflight == 1
    admission.release(object())  # (as a done callback: given the call)
    assert admission.breaker.inflight == 0
    admission.retire(lambda: None)
    assert admission.admit() is False  # (the draw of 0.0 would have dropped it: a retired cluster routes again)


def endpoint(address: str, weight: int = 1, draining: bool = False) -> Endpoint:
    return Endpoint((address,), weight, draining)


def locality(zone: str, weight: int, *endpoints: Endpoint) -> Locality:
    return Locality("r", zone, "", weight, endpoints)


def test_an_endpoints_share_is_its_localitys_by_weight_times_its_own_and_draining_ones_get_none() -> None:
    assert shares([locality("a", 3, endpoint("10.0.0.1:80", 1), endpoint("10.0.0.2:80", 3)),
                   locality("b", 1, endpoint("[::1]:80"), endpoint("10.0.0.4:80", draining=True))]) == {
        "ipv4:10.0.0.1:80": 0.75, "ipv4:10.0.0.2:80": 2.25, "ipv6:[::1]:80": 1.0}


def test_priorities_without_endpoints_are_left_out_and_each_next_serves_while_those_before_fail() -> None:
    assignment = ClusterLoadAssignment("c", (
        (locality("a", 1, endpoint("10.0.0.1:80")),),
        (locality("b", 1, endpoint("10.0.0.2:80", draining=True)),),
        (locality("c", 1, endpoint("10.0.0.3:80")),),
        (locality("d", 1, endpoint("10.0.0.4:80")),)), ())
    ordered = priorities(assignment)
    assert ordered == [{"ipv4:10.0.0.1:80": 1.0}, {"ipv4:10.0.0.3:80": 1.0}, {"ipv4:10.0.0.4:80": 1.0}]
    failing: Dict[str, bool] = {}

    def fails(endpoints: Dict[str, float]) -> bool:
        return all(failing.get(target, False) for target in endpoints)

    assert serving(ordered, fails) == {"ipv4:10.0.0.1:80": 1.0}
    failing["ipv4:10.0.0.1:80"] = True
    assert serving(ordered, fails) == {"ipv4:10.0.0.1:80": 1.0, "ipv4:10.0.0.3:80": 1.0}
    failing["ipv4:10.0.0.3:80"] = failing["ipv4:10.0.0.4:80"] = True
    assert list(serving(ordered, fails)) == ["ipv4:10.0.0.1:80", "ipv4:10.0.0.3:80", "ipv4:10.0.0.4:80"]
    assert priorities(None) == [] and serving([], fails) == {}


def test_a_cluster_with_no_endpoint_says_why_as_grpcio_does() -> None:
    assert empty("c", None) == ""
    assert "weighted_target policy" in empty("c", ClusterLoadAssignment("c", (), ())) and \
        "EDS resource c: contains no localities" in empty("c", ClusterLoadAssignment("c", (), ()))
    why = empty("c", ClusterLoadAssignment("c", ((locality("z", 1),),), ()))
    assert why.startswith("no children in weighted_target policy") and \
        'contains empty localities: [{region="r", zone="z", sub_zone=""}]' in why
    assert empty("c", ClusterLoadAssignment("c", ((locality("z", 1, endpoint("10.0.0.1:80")),),), ())) == ""


WRR = "weighted_round_robin"


def test_a_replaced_lb_policy_is_told_of_once_per_cluster_and_policy_asked_for(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="grpc_retry")
    assert in_force(WRR) == in_force("pick_first") == "round_robin"
    assert in_force("ring_hash") == "ring_hash"
    assert in_force("wrr_locality(round_robin)") == "wrr_locality(round_robin)"
    replacements = Replacements()
    for cluster, asked in [("a", WRR), ("a", WRR), ("b", "round_robin"), ("a", "pick_first"),
                           ("a", "round_robin"), ("a", "pick_first")]:
        replacements.note(cluster, asked)
    replacements.keep({"b"})
    replacements.note("b", WRR)
    replacements.keep({"a"})  # (b leaves the config: told of again when it comes back)
    replacements.note("b", WRR)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"xDS cluster {cluster!r} asks for the {asked} load-balancing policy, which grpc_retry does not "
                    f"have: round_robin serves it")
        for cluster, asked in [("a", WRR), ("a", "pick_first"), ("a", "pick_first"), ("b", WRR),
                               ("b", WRR)]]
