"""A cluster's retry budget: its Cluster resource's DEFAULT circuit-breaker threshold's `retry_budget` and explicit
`max_retries` (clusters.py), kept as the core's RetryBudget that its calls' machines ask. A change of settings
gives the cluster a new budget (calls in flight keep theirs); the same settings keep the budget and its count."""

from __future__ import annotations

from typing import Optional

from grpc_retry._budget import RetryBudgetSettings, new_budget
from grpc_retry._core import RetryBudget


class ClusterRetryBudget:
    __slots__ = ("settings", "budget")

    def __init__(self) -> None:
        self.settings: Optional[RetryBudgetSettings] = None
        self.budget: Optional[RetryBudget] = None

    def update(self, settings: Optional[RetryBudgetSettings]) -> None:
        if settings != self.settings:
            self.settings = settings
            self.budget = None if settings is None else new_budget(settings)
