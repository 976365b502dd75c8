"""The shape of `channel.retry_stats()`: per method, what A6's "Retry and Hedging Statistics" counts."""

from __future__ import annotations

from typing import Dict, TypedDict


class _Counts(TypedDict):
    retry_attempts: int          # retries and hedges after the first attempt, made
    retry_attempts_failed: int   # of those, the ones that failed
    histogram: Dict[str, int]    # ">=1" ... ">=1000": which retry of its call each was


class MethodStats(_Counts, total=False):
    """One method's statistics. The hedging keys are there when a hedging method runs with
    `grpc_retry.hedging_quantile` or `grpc_retry.max_extra_load`."""

    hedging_delay: float              # seconds: the delay before the next hedge now
    hedges_not_sent_for_budget: int   # hedges that were due but over `grpc_retry.max_extra_load`
