"""The xDS resource types the client subscribes to, each decoded from its protobuf and checked as gRPC's core
checks it: a resource it would reject is rejected here (ResourceError), and its response NACKed. Needs the envoy
protos (`grpc_retry[xds]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

try:
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.config.listener.v3 import listener_pb2
    from envoy.config.route.v3 import route_pb2
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
except ImportError as error:  # pragma: no cover (the extra is missing)
    raise ImportError("an xds: target needs grpc_retry's xds extra: pip install 'grpc_retry[xds]'") from error

_HCM = "type.googleapis.com/" + http_connection_manager_pb2.HttpConnectionManager.DESCRIPTOR.full_name


class ResourceError(ValueError):
    """A resource gRPC's core would reject: `name` (None where it cannot be told) and every problem found."""

    def __init__(self, name: Optional[str], errors: List[str]) -> None:
        self.name = name
        self.errors = errors
        super().__init__("; ".join(errors))


@dataclass(frozen=True)
class ResourceType:
    """One resource type: its type URL, what decodes and checks one (→ (name, value)), and whether a response of
    it holds every subscribed resource (a resource missing from one is deleted: Listener and Cluster)."""

    name: str
    url: str
    decode: Callable[[bytes], Tuple[str, Any]]
    every_name_in_response: bool


@dataclass(frozen=True)
class Listener:
    """A client Listener: the RouteConfiguration it names (RDS), or the one it holds."""

    route_config_name: Optional[str]
    route_config: Any


def _listener(data: bytes) -> Tuple[str, Listener]:
    listener = listener_pb2.Listener.FromString(data)
    name, errors = listener.name, []
    if not listener.HasField("api_listener"):
        raise ResourceError(name, ["Listener has neither address nor ApiListener"])
    packed = listener.api_listener.api_listener
    if packed.type_url != _HCM:
        raise ResourceError(name, [f"api_listener.api_listener: unsupported type {packed.type_url!r}"])
    manager = http_connection_manager_pb2.HttpConnectionManager()
    if not packed.Unpack(manager):
        raise ResourceError(name, ["api_listener.api_listener: cannot be decoded"])
    route_name, route_config = None, None
    if manager.HasField("rds"):
        source = manager.rds.config_source
        if not (source.HasField("ads") or source.HasField("self")):
            errors.append("rds.config_source: must be ads or self")
        route_name = manager.rds.route_config_name
    elif manager.HasField("route_config"):
        route_config = manager.route_config
    else:
        errors.append("HttpConnectionManager neither has inlined route_config nor RDS")
    if errors:
        raise ResourceError(name, errors)
    return name, Listener(route_name, route_config)


def _route(data: bytes) -> Tuple[str, Any]:
    route = route_pb2.RouteConfiguration.FromString(data)
    return route.name, route


def _cluster(data: bytes) -> Tuple[str, Any]:
    cluster = cluster_pb2.Cluster.FromString(data)
    return cluster.name, cluster


def _endpoints(data: bytes) -> Tuple[str, Any]:
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(data)
    return assignment.cluster_name, assignment


def _url(message: Any) -> str:
    return f"type.googleapis.com/{message.DESCRIPTOR.full_name}"


LISTENER = ResourceType("Listener", _url(listener_pb2.Listener), _listener, True)
ROUTE_CONFIGURATION = ResourceType("RouteConfiguration", _url(route_pb2.RouteConfiguration), _route, False)
CLUSTER = ResourceType("Cluster", _url(cluster_pb2.Cluster), _cluster, True)
CLUSTER_LOAD_ASSIGNMENT = ResourceType("ClusterLoadAssignment", _url(endpoint_pb2.ClusterLoadAssignment),
                                       _endpoints, False)
TYPES = {t.url: t for t in (LISTENER, ROUTE_CONFIGURATION, CLUSTER, CLUSTER_LOAD_ASSIGNMENT)}
