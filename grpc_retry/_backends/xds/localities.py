"""An EDS cluster's localities (gRPC's weighted_target over them): each endpoint's share of its priority's calls is
its locality's share by weight times its own within the locality by its weight; draining endpoints get none. And
why a cluster whose localities hold no endpoint has none, in the installed grpcio's words."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Tuple

import grpc

from grpc_retry._backends.target import address_target
from grpc_retry._version import grpcio_minor


def shares(localities: Iterable[Any], weights: bool = False) -> Dict[str, float]:
    """The endpoints of one priority's localities, as subchannel targets, each with its share of the calls (with
    `weights`: its weight times its locality's, as gRPC's ring_hash weighs it)."""
    endpoints: Dict[str, float] = {}
    for locality in localities:
        kept = [endpoint for endpoint in locality.endpoints if not endpoint.draining]
        total = 1 if weights else sum(endpoint.weight for endpoint in kept)
        for endpoint in kept:
            endpoints[_target(endpoint.addresses[0])] = locality.weight * endpoint.weight / total
    return endpoints


def locality_of(assignment: Any) -> Dict[str, Tuple[str, str, str]]:
    """Each endpoint's locality (region, zone, sub_zone), by subchannel target (load reports)."""
    return {_target(endpoint.addresses[0]): (locality.region, locality.zone, locality.sub_zone)
            for priority in (() if assignment is None else assignment.priorities) for locality in priority
            for endpoint in locality.endpoints}


def empty(eds_name: str, assignment: Any) -> str:
    """Why an EDS cluster has no endpoint at all, as the installed grpcio says it ("" where it says otherwise:
    ours)."""
    if assignment is None:
        return ""
    localities = sorted((locality for priority in assignment.priorities for locality in priority),
                        key=lambda locality: (locality.region, locality.zone, locality.sub_zone))
    if not localities:
        why = f"EDS resource {eds_name}: contains no localities"
    elif any(locality.endpoints for locality in localities):
        return ""
    else:
        places = "; ".join(f'{{region="{locality.region}", zone="{locality.zone}", sub_zone="{locality.sub_zone}"}}'
                           for locality in localities)
        why = f"EDS resource {eds_name}: contains empty localities: [{places}]"
    if grpcio_minor(grpc.__version__) < (1, 72):
        return f"no children in weighted_target policy: {why}"
    return f"no children in weighted_target policy ({why})"


def _target(address: str) -> str:
    host, port = address.rsplit(":", 1)
    return address_target(host.strip("[]"), int(port))
