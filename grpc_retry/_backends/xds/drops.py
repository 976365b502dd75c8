"""A cluster's drops (EDS `drop_overloads`): each category drops its share of the calls, drawn afresh per call, as
gRPC's cluster_impl policy drops them, before its circuit breaker counts the call."""

from __future__ import annotations

import random
from typing import Callable, Dict, Tuple

from grpc_retry._backends.xds.errors import RouteError


class Drops:
    """The categories of one cluster's endpoints (replaced whole with each EDS update) and the draw that decides;
    the calls dropped since load reports last took them, by category (and those its circuit breaker dropped)."""

    __slots__ = ("categories", "_draw", "_dropped", "uncategorized")

    def __init__(self, draw: Callable[[], float] = random.random) -> None:
        self.categories: Tuple[Tuple[str, int], ...] = ()  # (category, per million)
        self._draw = draw
        self._dropped: Dict[str, int] = {}
        self.uncategorized = 0

    def check(self) -> None:
        """RouteError (the call fails UNAVAILABLE, gRPC's words) if a category drops the call."""
        for category, per_million in self.categories:
            if self._draw() * 1_000_000 < per_million:
                self._dropped[category] = self._dropped.get(category, 0) + 1
                raise RouteError(f"EDS-configured drop: {category}")

    def take_dropped(self) -> Tuple[Dict[str, int], int]:
        """The drops by category, and the others, since the last time (load reports); they start again from 0."""
        dropped, self._dropped = self._dropped, {}
        uncategorized, self.uncategorized = self.uncategorized, 0
        return dropped, uncategorized
