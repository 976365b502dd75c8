"""An EDS cluster's priorities (gRPC's priority policy): calls go to the first priority, and to each next one
while every subchannel of those before it is failing; a priority with no endpoint is skipped."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from grpc_retry._backends.xds.localities import shares

Endpoints = Dict[str, float]  # subchannel target -> its share of the priority's calls


def priorities(assignment: Any, weights: bool = False) -> List[Endpoints]:
    """A cluster's endpoints per priority that has any, in order (None: an assignment not yet had: none); with
    `weights`, each endpoint's weight (as ring_hash weighs it) in place of its share."""
    if assignment is None:
        return []
    return [endpoints for endpoints in (shares(p, weights) for p in assignment.priorities) if endpoints]


def serving(ordered: List[Endpoints], failing: Callable[[Endpoints], bool]) -> Endpoints:
    """The endpoints the cluster's subchannels are to have: those of the first priority, and of each next one
    while `failing` says every subchannel of the one before has failed (their shares as each priority's)."""
    endpoints: Endpoints = {}
    for priority in ordered:
        endpoints.update(priority)
        if not failing(priority):
            break
    return endpoints
