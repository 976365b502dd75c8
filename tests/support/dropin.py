"""Side by side: a scenario through grpcio's channel and through grpc_retry's, each on a fresh server."""

from __future__ import annotations

from typing import Any, Callable

from support.backend import Backend


def side_by_side(scenario: Callable[[Callable[..., Any], Backend], Any], ours: Callable[..., Any],
                 theirs: Callable[..., Any]) -> Any:
    """The scenario's observation through grpcio and through ours, each on a fresh server; asserts equality."""
    results = []
    for make in (theirs, ours):
        backend = Backend()
        try:
            results.append(scenario(make, backend))
        finally:
            backend.stop()
    expected, observed = results
    assert observed == expected
    return observed
