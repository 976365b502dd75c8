"""A cluster's admission of calls, as gRPC's cluster_impl policy makes it: its drops (drops.py), then its circuit
breaker (circuit_breaker.py). The channels call it as any cluster's admission: admit() as a call is sent to the
cluster, release() when it ends; `budget`, its retry budget (retry_budget.py), is what its calls' retries count
against."""

from __future__ import annotations

import random
from typing import Any, Callable, Optional

from grpc_retry._backends.xds.circuit_breaker import CircuitBreaker
from grpc_retry._backends.xds.drops import Drops
from grpc_retry._backends.xds.errors import RouteError
from grpc_retry._backends.xds.retry_budget import ClusterRetryBudget
from grpc_retry._core import RetryBudget


class ClusterImpl:
    __slots__ = ("drops", "breaker", "retries")

    def __init__(self, draw: Callable[[], float] = random.random) -> None:
        self.drops = Drops(draw)
        self.breaker = CircuitBreaker()
        self.retries = ClusterRetryBudget()

    @property
    def budget(self) -> Optional[RetryBudget]:
        return self.retries.budget

    def admit(self) -> bool:
        """A call enters the cluster (release() when it ends); False: the cluster was retired since the call was
        routed to it (the config now names its successor). RouteError: the call is dropped."""
        if self.breaker.retired:  # (before the drops: the call routes again, and its new cluster's apply)
            return False
        self.drops.check()
        try:
            return self.breaker.admit()
        except RouteError:
            self.drops.uncategorized += 1  # (load reports count circuit-breaker drops without a category)
            raise

    def release(self, _: Any = None) -> None:
        """A call admitted has ended (a done callback's argument, if any, is the call)."""
        self.breaker.release()

    def retire(self, drained: Callable[[], None]) -> None:
        """No call enters any more; `drained` is told once the last one in flight has ended."""
        self.breaker.retire(drained)
