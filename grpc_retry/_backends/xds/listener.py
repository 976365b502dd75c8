"""Listener (LDS) resources of a client, checked as gRPC's core checks them: an API listener holding an
HttpConnectionManager whose routes are inline or named (RDS over ADS), and whose HTTP filters end with the router.
Fault injection filters are run (fault.py); the others a gRPC client accepts are not; filters a client does not
run fail the resource unless they are optional."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Set, Tuple

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from grpc_retry._backends.xds import fault, routes
from grpc_retry._backends.xds.errors import Errors, ResourceError, parsed, type_name

_PREFIX = "type.googleapis.com/"
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "envoy.extensions.filters.http.router.v3.Router"
# The filters a gRPC client accepts (fault injection, run; cookie affinity, GCP authentication: not run)
CLIENT_FILTERS = (fault.FAULT,
                  "envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
                  "envoy.extensions.filters.http.gcp_authn.v3.GcpAuthnFilterConfig", ROUTER)
SERVER_FILTERS = ("envoy.extensions.filters.http.rbac.v3.RBAC",)
_TYPED_STRUCTS = ("xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct")
MAX_SECONDS = 315576000000
Faults = Tuple[Tuple[str, fault.Fault], ...]


@dataclass(frozen=True)
class Listener:
    """A client Listener: the RouteConfiguration it names (RDS), or the one it holds; the default longest a call
    may last (its HttpConnectionManager's max_stream_duration: None, no limit)."""

    route_config_name: Optional[str]
    route_config: Optional[routes.RouteConfiguration]
    max_stream_duration: Optional[float]
    filters: Tuple[str, ...]  # the HTTP filters' config types, in order
    faults: Faults = ()  # the fault filters' names and configs, in order


def decode(data: bytes) -> Tuple[str, Listener]:
    listener = parsed(listener_pb2.Listener, data, "Listener")
    name = listener.name
    if not listener.HasField("api_listener"):
        raise ResourceError(name, ["Listener has neither address nor ApiListener"])
    errors = Errors("Listener", name)
    where = "api_listener.api_listener"
    packed = listener.api_listener.api_listener
    if not listener.api_listener.HasField("api_listener"):
        errors.add(where, "field not present")
        errors.raise_if_any()
    kind = type_name(packed.type_url, f"{where}.type_url", errors)
    if kind is None:
        errors.raise_if_any()
    if kind != HCM:
        errors.add(f"{where}.value[{kind}]", "unsupported filter type")
        errors.raise_if_any()
    where = f"{where}.value[{HCM}]"
    manager = hcm_pb2.HttpConnectionManager()
    try:
        manager.ParseFromString(packed.value)
    except Exception:  # noqa: BLE001
        errors.add(where, "could not parse HttpConnectionManager config")
        errors.raise_if_any()
    value = _manager(manager, where, errors, name)
    errors.raise_if_any()
    return name, value


def _manager(manager: Any, where: str, errors: Errors, name: str) -> Listener:
    if manager.xff_num_trusted_hops != 0:
        errors.add(f"{where}.xff_num_trusted_hops", "must be zero")
    if len(manager.original_ip_detection_extensions):
        errors.add(f"{where}.original_ip_detection_extensions", "must be empty")
    duration = None
    options = manager.common_http_protocol_options
    if manager.HasField("common_http_protocol_options") and options.HasField("max_stream_duration"):
        duration = routes.duration(options.max_stream_duration,
                                   f"{where}.common_http_protocol_options.max_stream_duration", errors) or None
    filters, faults = _filters(manager, where, errors)
    route_name, route_config = None, None
    if manager.HasField("route_config"):
        route_config = routes.read(manager.route_config, f"{where}.route_config", errors)
    elif manager.HasField("rds"):
        if not manager.rds.HasField("config_source"):
            errors.add(f"{where}.rds.config_source", "field not present")
        elif not (manager.rds.config_source.HasField("ads") or manager.rds.config_source.HasField("self")):
            errors.add(f"{where}.rds.config_source", "ConfigSource does not specify ADS or SELF")
        route_name = manager.rds.route_config_name
    else:
        errors.add(where, "neither route_config nor rds fields are present")
    return Listener(route_name, route_config, duration, filters, faults)


def _filters(manager: Any, where: str, errors: Errors) -> Tuple[Tuple[str, ...], Faults]:
    kept = []
    faults = []
    names: Set[str] = set()
    before = errors.count()
    for i, http_filter in enumerate(manager.http_filters):
        at = f"{where}.http_filters[{i}]"
        if not http_filter.name:
            errors.add(f"{at}.name", "empty filter name")
            continue
        if http_filter.name in names:
            errors.add(f"{at}.name", f"duplicate HTTP filter name: {http_filter.name}")
            continue
        names.add(http_filter.name)
        if not http_filter.HasField("typed_config"):
            errors.add(f"{at}.typed_config", "field not present")
            continue
        kind = type_name(http_filter.typed_config.type_url, f"{at}.typed_config.type_url", errors)
        if kind is None:
            continue
        if kind in _TYPED_STRUCTS:
            kind = _struct_type(http_filter.typed_config.value) or kind
            if kind == ROUTER:
                errors.add(f"{at}.typed_config.value[{kind}]", "could not parse router filter config")
                continue
        if kind not in CLIENT_FILTERS:
            if not http_filter.is_optional:
                errors.add(f"{at}.typed_config.value[{kind}]", "filter is not supported on clients"
                           if kind in SERVER_FILTERS else "unsupported filter type")
            continue
        kept.append(kind)
        if kind == fault.FAULT and not http_filter.disabled:
            value = f"{at}.typed_config.value[{kind}]"
            config = None
            if http_filter.typed_config.type_url.endswith(fault.FAULT):
                config = fault.parse(http_filter.typed_config.value, value, errors)
            else:  # (a TypedStruct)
                errors.add(value, "could not parse fault injection filter config")
            if config is not None:
                faults.append((http_filter.name, config))
    if not kept and errors.count() == before:
        errors.add(f"{where}.http_filters", "expected at least one HTTP filter")
    for i, kind in enumerate(kept):
        last = i == len(kept) - 1
        if kind == ROUTER and not last:
            errors.add(f"{where}.http_filters", f"terminal filter for config type {kind} must be the last filter "
                                                "in the chain")
        elif kind != ROUTER and last:
            errors.add(f"{where}.http_filters", f"non-terminal filter for config type {kind} is the last filter "
                                                "in the chain")
    return tuple(kept), tuple(faults)


def _struct_type(data: bytes) -> Optional[str]:
    """The type a TypedStruct stands for."""
    from xds.type.v3 import typed_struct_pb2

    try:
        url = typed_struct_pb2.TypedStruct.FromString(data).type_url
    except Exception:  # noqa: BLE001
        return None
    return url[url.rfind("/") + 1:] if url else None
