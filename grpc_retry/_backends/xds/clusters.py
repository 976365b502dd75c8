"""Cluster (CDS) resources, checked as gRPC's core checks them: an EDS cluster (endpoints from ADS), a LOGICAL_DNS
one or an aggregate of others; its load-balancing policy, circuit breaker (gRFC A32: `max_requests` of the first
DEFAULT threshold, 1024 unless set), outlier detection (gRFC A50: on only when the field is present) and the TLS its
transport socket asks for (gRFC A29, upstream_tls.py). grpc_retry reads the DEFAULT threshold's `retry_budget` and
an explicit `max_retries` too (grpc's core ignores them): the cluster's retry budget, concurrency form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any, Optional, Tuple

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2

from grpc_retry._backends.xds.errors import Errors, parsed
from grpc_retry._backends.xds.routes import duration
from grpc_retry._backends.xds.upstream_tls import UpstreamTls
from grpc_retry._backends.xds.upstream_tls import parse as parse_tls
from grpc_retry._budget import UNBOUNDED, RetryBudgetSettings
from grpc_retry._config import FailurePercentageEjection, OutlierDetection, SuccessRateEjection

EDS, LOGICAL_DNS, AGGREGATE = "EDS", "LOGICAL_DNS", "AGGREGATE"
_AGGREGATE = "envoy.extensions.clusters.aggregate.v3.ClusterConfig"
_POLICIES = {"envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin": "round_robin",
             "envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash": "ring_hash",
             "envoy.extensions.load_balancing_policies.wrr_locality.v3.WrrLocality": "wrr_locality",
             "envoy.extensions.load_balancing_policies.pick_first.v3.PickFirst": "pick_first",
             "envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3."
             "ClientSideWeightedRoundRobin": "weighted_round_robin"}
DEFAULT_MAX_REQUESTS = 1024
MAX_RING_SIZE = 8388608


@dataclass(frozen=True)
class Cluster:
    name: str
    kind: str  # EDS, LOGICAL_DNS or AGGREGATE
    eds_name: str  # EDS: the ClusterLoadAssignment's name ("": the cluster's)
    dns_target: str  # LOGICAL_DNS: host:port
    children: Tuple[str, ...]  # AGGREGATE: the clusters, in priority order
    lb_policy: str  # as asked for: e.g. "round_robin", "ring_hash", "wrr_locality(round_robin)"
    max_requests: int
    outlier_detection: Optional[OutlierDetection]  # as the service config's outlier_detection_experimental reads
    tls: Optional[UpstreamTls]  # what its transport socket asks for (None: plaintext)
    retry_budget: Optional[RetryBudgetSettings] = None  # retry_budget and max_retries (None: neither)
    ring_sizes: Tuple[int, int] = (1024, MAX_RING_SIZE)  # ring_hash: the ring's minimum and maximum size
    load_reports: bool = False  # its lrs_server is the management server (self): its loads are reported there


def decode(data: bytes, certificate_providers: AbstractSet[str] = frozenset()) -> Tuple[str, Cluster]:
    """A Cluster from its bytes; ResourceError as gRPC's core words it. `certificate_providers`: the names the
    client's bootstrap gives its certificate providers, the only ones the cluster's TLS may name."""
    cluster = parsed(cluster_pb2.Cluster, data, "Cluster")
    errors = Errors("Cluster", cluster.name)
    kind, eds_name, dns_target, children = _discovery(cluster, errors)
    policy, ring_sizes = _lb_policy(cluster, errors)
    max_requests = DEFAULT_MAX_REQUESTS
    budget = None
    for threshold in cluster.circuit_breakers.thresholds:
        if threshold.priority == base_pb2.DEFAULT:
            if threshold.HasField("max_requests"):
                max_requests = threshold.max_requests.value
            budget = _retry_budget(threshold, errors)
            break
    detection = _outlier_detection(cluster.outlier_detection, errors) if cluster.HasField("outlier_detection") \
        else None
    tls = parse_tls(cluster.transport_socket, certificate_providers, errors) if cluster.HasField("transport_socket") \
        else None
    if cluster.HasField("lrs_server") and not cluster.lrs_server.HasField("self"):
        errors.add("lrs_server", "ConfigSource is not self")
    errors.raise_if_any()
    return cluster.name, Cluster(cluster.name, kind, eds_name, dns_target, children, policy, max_requests, detection,
                                 tls, budget, ring_sizes, cluster.HasField("lrs_server"))


def _retry_budget(threshold: Any, errors: Errors) -> Optional[RetryBudgetSettings]:
    """The DEFAULT threshold's retry budget (Envoy's defaults: 20%, at least 3) and explicit max_retries, a cap on
    the retries in flight besides (where Envoy lets a budget override max_retries, both apply here)."""
    cap = threshold.max_retries.value if threshold.HasField("max_retries") else -1
    if not threshold.HasField("retry_budget"):
        return None if cap < 0 else RetryBudgetSettings(True, 100.0, UNBOUNDED, max_in_flight=cap)
    budget = threshold.retry_budget
    percent = budget.budget_percent.value if budget.HasField("budget_percent") else 20.0
    if not 0.0 <= percent <= 100.0:
        errors.add("circuit_breakers.thresholds.retry_budget.budget_percent", "must be from 0 to 100")
        return None
    floor = budget.min_retry_concurrency.value if budget.HasField("min_retry_concurrency") else 3
    return RetryBudgetSettings(True, percent, floor, max_in_flight=cap)


def _discovery(cluster: Any, errors: Errors) -> Tuple[str, str, str, Tuple[str, ...]]:
    if cluster.HasField("cluster_type"):
        if not cluster.cluster_type.HasField("typed_config"):
            errors.add("cluster_type.typed_config", "field not present")
            return AGGREGATE, "", "", ()
        kind = cluster.cluster_type.typed_config.type_url.rsplit("/", 1)[-1]
        if kind != _AGGREGATE:
            errors.add("cluster_type.typed_config.type_url", f"unknown cluster_type extension: {kind}")
            return AGGREGATE, "", "", ()
        from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2

        config = aggregate_pb2.ClusterConfig()
        if not cluster.cluster_type.typed_config.Unpack(config):
            errors.add(f"cluster_type.typed_config.value[{kind}]", "can't parse aggregate cluster config")
            return AGGREGATE, "", "", ()
        if not config.clusters:
            errors.add(f"cluster_type.typed_config.value[{kind}].clusters", "must be non-empty")
        return AGGREGATE, "", "", tuple(config.clusters)
    if cluster.type == cluster_pb2.Cluster.EDS:
        if not cluster.HasField("eds_cluster_config") or not cluster.eds_cluster_config.HasField("eds_config"):
            errors.add("eds_cluster_config.eds_config" if cluster.HasField("eds_cluster_config")
                       else "eds_cluster_config", "field not present")
        else:
            source = cluster.eds_cluster_config.eds_config
            if not (source.HasField("ads") or source.HasField("self")):
                errors.add("eds_cluster_config.eds_config", "ConfigSource is not ads or self")
        service = cluster.eds_cluster_config.service_name
        if not service and cluster.name.startswith("xdstp:"):
            errors.add("eds_cluster_config.service_name", "must be set if Cluster resource has an xdstp name")
        return EDS, service, "", ()
    if cluster.type == cluster_pb2.Cluster.LOGICAL_DNS:
        return LOGICAL_DNS, "", _dns_target(cluster, errors), ()
    errors.add("type", "unknown discovery type")
    return EDS, "", "", ()


def _dns_target(cluster: Any, errors: Errors) -> str:
    if not cluster.HasField("load_assignment"):
        errors.add("load_assignment", "field not present for LOGICAL_DNS cluster")
        return ""
    localities = cluster.load_assignment.endpoints
    if len(localities) != 1:
        errors.add("load_assignment", f"must contain exactly one locality for LOGICAL_DNS cluster, found "
                                      f"{len(localities)}")
        return ""
    endpoints = localities[0].lb_endpoints
    if len(endpoints) != 1:
        errors.add("load_assignment.endpoints[0].lb_endpoints", f"must contain exactly one endpoint for LOGICAL_DNS "
                                                                f"cluster, found {len(endpoints)}")
        return ""
    at = "load_assignment.endpoints[0].lb_endpoints[0].endpoint"
    endpoint = endpoints[0]
    if not endpoint.HasField("endpoint") or not endpoint.endpoint.HasField("address") or \
            not endpoint.endpoint.address.HasField("socket_address"):
        errors.add(at, "field not present")
        return ""
    socket = endpoint.endpoint.address.socket_address
    if socket.resolver_name:
        errors.add(f"{at}.address.socket_address.resolver_name", "LOGICAL_DNS clusters must NOT have a custom "
                                                                 "resolver name set")
    if not socket.address:
        errors.add(f"{at}.address.socket_address.address", "field not present")
    if socket.WhichOneof("port_specifier") != "port_value":
        errors.add(f"{at}.address.socket_address.port_value", "field not present")
    host = f"[{socket.address}]" if ":" in socket.address else socket.address
    return f"{host}:{socket.port_value}"


def _lb_policy(cluster: Any, errors: Errors) -> Tuple[str, Tuple[int, int]]:
    """The policy the cluster asks for, and (ring_hash) its ring's sizes, checked as gRPC's core checks them."""
    sizes = (1024, MAX_RING_SIZE)
    if cluster.HasField("load_balancing_policy"):
        known = _first_known(cluster.load_balancing_policy)
        if known is None:
            errors.add("load_balancing_policy", "no supported load balancing policy config found")
            return "round_robin", sizes
        name, config = known
        if name == "ring_hash":
            from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2

            ring = ring_hash_pb2.RingHash()
            at = "load_balancing_policy.policies[].typed_extension_config.typed_config"
            if not config.Unpack(ring):
                errors.add(at, "can't decode RingHash LB policy config")
                return name, sizes
            if ring.hash_function not in (ring.XX_HASH, ring.DEFAULT_HASH):
                errors.add(f"{at}.hash_function", "unsupported value (must be XX_HASH)")
            sizes = _ring_sizes(ring, f"{at}.", errors)
        return name, sizes
    if cluster.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN:
        return "round_robin", sizes
    if cluster.lb_policy == cluster_pb2.Cluster.RING_HASH:
        ring = cluster.ring_hash_lb_config
        if ring.hash_function != cluster_pb2.Cluster.RingHashLbConfig.XX_HASH:
            errors.add("ring_hash_lb_config.hash_function", "invalid hash function")
        return "ring_hash", _ring_sizes(ring, "ring_hash_lb_config.", errors)
    errors.add("lb_policy", "LB policy is not supported")
    return "round_robin", sizes


def _ring_sizes(ring: Any, at: str, errors: Errors) -> Tuple[int, int]:
    low = ring.minimum_ring_size.value if ring.HasField("minimum_ring_size") else 1024
    high = ring.maximum_ring_size.value if ring.HasField("maximum_ring_size") else MAX_RING_SIZE
    for field, value in (("minimum_ring_size", low), ("maximum_ring_size", high)):
        if not 1 <= value <= MAX_RING_SIZE:
            errors.add(f"{at}{field}", f"must be in the range of 1 to {MAX_RING_SIZE}")
    if ring.HasField("minimum_ring_size") and low > high:
        errors.add(f"{at}minimum_ring_size", "cannot be greater than maximum_ring_size")
    return low, high


def _first_known(policy: Any) -> Optional[Tuple[str, Any]]:
    """The first policy of a LoadBalancingPolicy that gRPC knows (None: none) and its config, wrr_locality's named
    with its child's, e.g. "wrr_locality(round_robin)": what serves its endpoints within a locality."""
    for entry in policy.policies:
        config = entry.typed_extension_config.typed_config
        name = _POLICIES.get(config.type_url.rsplit("/", 1)[-1])
        if name == "wrr_locality":
            from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2

            wrapper = wrr_locality_pb2.WrrLocality()
            child = _first_known(wrapper.endpoint_picking_policy) if config.Unpack(wrapper) else None
            return (name, config) if child is None else (f"{name}({child[0]})", child[1])
        if name is not None:
            return name, config
    return None


def _outlier_detection(detection: Any, errors: Errors) -> OutlierDetection:
    times = {}
    for field, default in (("interval", 10.0), ("base_ejection_time", 30.0), ("max_ejection_time", 30.0)):
        times[field] = default
        if detection.HasField(field):
            times[field] = duration(getattr(detection, field), f"outlier_detection.{field}", errors) or 0.0
    percent = detection.max_ejection_percent.value if detection.HasField("max_ejection_percent") else 10
    if percent > 100:
        errors.add("outlier_detection.max_ejection_percent", "value must be <= 100")

    def wrapped(field: str, default: int) -> int:
        return getattr(detection, field).value if detection.HasField(field) else default

    success = failure = None
    enforcing = wrapped("enforcing_success_rate", 0)
    if enforcing > 100:
        errors.add("outlier_detection.enforcing_success_rate", "value must be <= 100")
    if enforcing:
        success = SuccessRateEjection(wrapped("success_rate_stdev_factor", 1900), enforcing,
                                      wrapped("success_rate_minimum_hosts", 5),
                                      wrapped("success_rate_request_volume", 100))
    enforcing = wrapped("enforcing_failure_percentage", 0)
    if enforcing > 100:
        errors.add("outlier_detection.enforcing_failure_percentage", "value must be <= 100")
        if wrapped("failure_percentage_threshold", 85) > 100:
            errors.add("outlier_detection.failure_percentage_threshold", "value must be <= 100")
    if enforcing:
        failure = FailurePercentageEjection(wrapped("failure_percentage_threshold", 85), enforcing,
                                            wrapped("failure_percentage_minimum_hosts", 5),
                                            wrapped("failure_percentage_request_volume", 50))
    return OutlierDetection(times["interval"], times["base_ejection_time"], times["max_ejection_time"], percent,
                            success, failure)
