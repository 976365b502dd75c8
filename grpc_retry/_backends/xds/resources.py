"""The xDS resource types the client subscribes to, each decoded from its protobuf and checked as gRPC's core
checks it (listener.py, routes.py, clusters.py, endpoints.py): a resource it would reject is rejected here
(ResourceError), and its response NACKed. As in gRPC's core, a check may need the client's bootstrap: a
DecodeContext carries what of it they read. Needs the envoy protos (`grpc_retry[xds]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, Tuple

try:
    from grpc_retry._backends.xds import clusters, endpoints, listener, routes
except ImportError as error:  # pragma: no cover (the extra is missing)
    raise ImportError("grpc_retry's own xDS client needs its xds extra: pip install 'grpc_retry[xds]'") from error


@dataclass(frozen=True)
class DecodeContext:
    """What the checks of a resource read of the client's bootstrap (gRPC's XdsResourceType::DecodeContext): the
    names of its certificate providers, the only ones a Cluster's TLS may name."""

    certificate_providers: FrozenSet[str] = frozenset()


@dataclass(frozen=True)
class ResourceType:
    """One resource type: its name, type URL, what decodes and checks one (-> (name, value)), and whether a
    response of it holds every subscribed resource (a resource missing from one is deleted: Listener and
    Cluster)."""

    name: str
    url: str
    decode: Callable[[bytes, DecodeContext], Tuple[str, Any]]
    every_name_in_response: bool


def _alone(decode: Callable[[bytes], Tuple[str, Any]]) -> Callable[[bytes, DecodeContext], Tuple[str, Any]]:
    """A type whose checks need nothing of the bootstrap."""
    return lambda data, _: decode(data)


_PREFIX = "type.googleapis.com/envoy.config."
LISTENER = ResourceType("Listener", _PREFIX + "listener.v3.Listener", _alone(listener.decode), True)
ROUTE_CONFIGURATION = ResourceType("RouteConfiguration", _PREFIX + "route.v3.RouteConfiguration",
                                   _alone(routes.decode), False)
CLUSTER = ResourceType("Cluster", _PREFIX + "cluster.v3.Cluster",
                       lambda data, context: clusters.decode(data, context.certificate_providers), True)
CLUSTER_LOAD_ASSIGNMENT = ResourceType("ClusterLoadAssignment", _PREFIX + "endpoint.v3.ClusterLoadAssignment",
                                       _alone(endpoints.decode), False)
TYPES = {t.url: t for t in (LISTENER, ROUTE_CONFIGURATION, CLUSTER, CLUSTER_LOAD_ASSIGNMENT)}
