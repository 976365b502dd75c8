"""A cluster's drops (EDS `drop_overloads`): each category drops its share of the calls, drawn afresh per call, as
gRPC's cluster_impl policy drops them, before its circuit breaker counts the call."""

from __future__ import annotations

import random
from typing import Callable, Tuple

from grpc_retry._backends.xds.errors import RouteError


class Drops:
    """The categories of one cluster's endpoints (replaced whole with each EDS update) and the draw that decides."""

    __slots__ = ("categories", "_draw")

    def __init__(self, draw: Callable[[], float] = random.random) -> None:
        self.categories: Tuple[Tuple[str, int], ...] = ()  # (category, per million)
        self._draw = draw

    def check(self) -> None:
        """RouteError (the call fails UNAVAILABLE, gRPC's words) if a category drops the call."""
        for category, per_million in self.categories:
            if self._draw() * 1_000_000 < per_million:
                raise RouteError(f"EDS-configured drop: {category}")
