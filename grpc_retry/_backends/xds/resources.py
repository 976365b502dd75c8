"""The xDS resource types the client subscribes to, each decoded from its protobuf and checked as gRPC's core
checks it (listener.py, routes.py, clusters.py, endpoints.py): a resource it would reject is rejected here
(ResourceError), and its response NACKed. Needs the envoy protos (`grpc_retry[xds]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Tuple

try:
    from grpc_retry._backends.xds import clusters, endpoints, listener, routes
except ImportError as error:  # pragma: no cover (the extra is missing)
    raise ImportError("grpc_retry's own xDS client needs its xds extra: pip install 'grpc_retry[xds]'") from error


@dataclass(frozen=True)
class ResourceType:
    """One resource type: its name, type URL, what decodes and checks one (-> (name, value)), and whether a
    response of it holds every subscribed resource (a resource missing from one is deleted: Listener and
    Cluster)."""

    name: str
    url: str
    decode: Callable[[bytes], Tuple[str, Any]]
    every_name_in_response: bool


_PREFIX = "type.googleapis.com/envoy.config."
LISTENER = ResourceType("Listener", _PREFIX + "listener.v3.Listener", listener.decode, True)
ROUTE_CONFIGURATION = ResourceType("RouteConfiguration", _PREFIX + "route.v3.RouteConfiguration", routes.decode,
                                   False)
CLUSTER = ResourceType("Cluster", _PREFIX + "cluster.v3.Cluster", clusters.decode, True)
CLUSTER_LOAD_ASSIGNMENT = ResourceType("ClusterLoadAssignment", _PREFIX + "endpoint.v3.ClusterLoadAssignment",
                                       endpoints.decode, False)
TYPES = {t.url: t for t in (LISTENER, ROUTE_CONFIGURATION, CLUSTER, CLUSTER_LOAD_ASSIGNMENT)}
