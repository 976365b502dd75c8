"""ClusterLoadAssignment (EDS) resources, checked as gRPC's core checks them: localities by priority (contiguous
from 0), their weights, each endpoint's address (an IP literal), health and weight, and the drops the server asks
for. A locality of weight 0 and an endpoint neither healthy, unknown nor draining are left out, as gRPC does."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Dict, List, Tuple

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.type.v3 import percent_pb2

from grpc_retry._backends.xds.errors import Errors, parsed

_USED = (health_check_pb2.UNKNOWN, health_check_pb2.HEALTHY, health_check_pb2.DRAINING)
_PER_MILLION = {percent_pb2.FractionalPercent.HUNDRED: 10000, percent_pb2.FractionalPercent.TEN_THOUSAND: 100,
                percent_pb2.FractionalPercent.MILLION: 1}
_UINT32 = 2 ** 32 - 1


@dataclass(frozen=True)
class Endpoint:
    addresses: Tuple[str, ...]  # "ip:port" ("[ip6]:port"), the first the endpoint's own
    weight: int
    draining: bool
    hostname: str = ""


@dataclass(frozen=True)
class Locality:
    region: str
    zone: str
    sub_zone: str
    weight: int
    endpoints: Tuple[Endpoint, ...]


@dataclass(frozen=True)
class ClusterLoadAssignment:
    cluster_name: str
    priorities: Tuple[Tuple[Locality, ...], ...]  # priority 0 first
    drops: Tuple[Tuple[str, int], ...]  # (category, per million)


def decode(data: bytes) -> Tuple[str, ClusterLoadAssignment]:
    assignment = parsed(endpoint_pb2.ClusterLoadAssignment, data, "ClusterLoadAssignment")
    errors = Errors("ClusterLoadAssignment", assignment.cluster_name)
    entries = assignment.endpoints
    by_priority: Dict[int, List[Locality]] = {}
    seen_addresses: Dict[str, None] = {}
    for i, entry in enumerate(entries):
        if entry.load_balancing_weight.value == 0:
            continue  # (gRPC leaves it out before looking further)
        where = f"endpoints[{i}]"
        if not entry.HasField("locality"):
            errors.add(f"{where}.locality", "field not present")
            continue
        if entry.priority >= len(entries):
            errors.add(f"{where}.priority", f"priority {entry.priority} >= number of localities ({len(entries)})")
            continue
        place = entry.locality
        kept = [_endpoint(lb, f"{where}.lb_endpoints[{k}]", errors, seen_addresses)
                for k, lb in enumerate(entry.lb_endpoints)]
        locality = Locality(place.region, place.zone, place.sub_zone, entry.load_balancing_weight.value,
                            tuple(e for e in kept if e is not None))
        same = by_priority.setdefault(entry.priority, [])
        if any((o.region, o.zone, o.sub_zone) == (place.region, place.zone, place.sub_zone) for o in same):
            errors.add(f"{where}", f'duplicate locality {{region="{place.region}", zone="{place.zone}", '
                                   f'sub_zone="{place.sub_zone}"}} found in priority {entry.priority}')
            continue
        same.append(locality)
    top = max(by_priority) + 1 if by_priority else 0
    for priority in range(top):
        if priority not in by_priority:
            errors.add("endpoints", f"priority {priority} empty")
        elif sum(locality.weight for locality in by_priority[priority]) > _UINT32:
            errors.add("endpoints", f"sum of locality weights for priority {priority} exceeds uint32 max")
    drops = []
    for i, drop in enumerate(assignment.policy.drop_overloads):
        where = f"policy.drop_overloads[{i}]"
        if not drop.category:
            errors.add(f"{where}.category", "empty drop category name")
        if not drop.HasField("drop_percentage"):
            errors.add(f"{where}.drop_percentage", "field not present")
            continue
        scale = _PER_MILLION.get(drop.drop_percentage.denominator)
        if scale is None:
            errors.add(f"{where}.drop_percentage.denominator", "unknown denominator type")
            continue
        drops.append((drop.category, min((drop.drop_percentage.numerator * scale) & _UINT32, 1_000_000)))
    errors.raise_if_any()
    priorities = tuple(tuple(by_priority.get(p, ())) for p in range(top))
    return assignment.cluster_name, ClusterLoadAssignment(assignment.cluster_name, priorities, tuple(drops))


def _endpoint(lb: endpoint_pb2.LbEndpoint, where: str, errors: Errors, seen: Dict[str, None]) -> Endpoint | None:
    if lb.health_status not in _USED:
        return None  # (gRPC drops it unchecked)
    weight = lb.load_balancing_weight.value if lb.HasField("load_balancing_weight") else 1
    if weight == 0:
        errors.add(f"{where}.load_balancing_weight", "must be greater than 0")
    if not lb.HasField("endpoint"):
        errors.add(f"{where}.endpoint", "field not present")
        return None
    addresses = []
    first = _address(lb.endpoint, f"{where}.endpoint", errors)
    if first is not None:
        addresses.append(first)
    for k, extra in enumerate(lb.endpoint.additional_addresses):
        address = _address(extra, f"{where}.endpoint.additional_addresses[{k}]", errors)
        if address is not None:
            addresses.append(address)
    for address in addresses:
        if address in seen:
            errors.add(where, f'duplicate endpoint address "{_uri(address)}"')
        seen[address] = None
    if first is None or weight == 0:
        return None
    return Endpoint(tuple(addresses), weight, lb.health_status == health_check_pb2.DRAINING, lb.endpoint.hostname)


def _address(holder: object, where: str, errors: Errors) -> str | None:
    if not holder.HasField("address"):  # type: ignore[attr-defined]
        errors.add(f"{where}.address", "field not present")
        return None
    address = holder.address  # type: ignore[attr-defined]
    if not address.HasField("socket_address"):
        errors.add(f"{where}.address.socket_address", "field not present")
        return None
    socket = address.socket_address
    if socket.port_value > 65535:
        errors.add(f"{where}.address.socket_address.port_value", "invalid port")
        return None
    try:
        ip = ipaddress.ip_address(socket.address)
    except ValueError:
        host = f"[{socket.address}]" if ":" in socket.address else socket.address
        errors.add(f"{where}.address.socket_address", f"Failed to parse address:{host}:{socket.port_value}")
        return None
    return f"[{ip}]:{socket.port_value}" if ip.version == 6 else f"{ip}:{socket.port_value}"


def _uri(address: str) -> str:
    return f"ipv6:{address}" if address.startswith("[") else f"ipv4:{address}"
