"""What `channel.retry_stats()` and `channel.throttle` return: immutable snapshots, taken when asked for."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Dict, Iterator, Mapping, Optional

if TYPE_CHECKING:
    from grpc_retry._backends.outliers import OutlierStats
    from grpc_retry._core import CallPolicy, RetryThrottle


@dataclass(frozen=True)
class MethodStats:
    """One method's calls since the channel was made (A6 "Retry and Hedging Statistics", and more).

    A6's own two counters are `retry_attempts` (every attempt after a call's first counted one: retries and
    hedges) and `retry_attempts_failed`; `histogram` counts each of those by which retry of its call it was
    (">=1" ... ">=1000", the largest threshold it reached)."""

    calls: int                      # logical calls ended
    attempts: int                   # grpcio calls made for them, transparent retries included
    retries: int                    # attempts after the first under a retry policy
    hedges: int                     # attempts after the first under a hedging policy
    retry_attempts: int             # A6: retries + hedges
    retry_attempts_failed: int      # A6: of those, the ones that failed
    transparent_retries: int        # attempts the server's application never saw, sent again
    committed_by_overflow: int      # calls that committed because the replay buffer was full
    stopped_by_throttling: int      # calls that ended failed because throttling stopped their next attempt
    stopped_by_pushback: int        # ... because the server's pushback said not to retry
    stopped_by_attempt_limit: int   # ... because maxAttempts was reached
    histogram: Mapping[str, int]
    hedging_delay: Optional[float] = None   # adaptive hedging: seconds before the next hedge, now
    hedges_not_sent_for_budget: int = 0     # hedges due but over `grpc_retry.max_extra_load`
    attempts_timed_out: int = 0             # attempts cancelled by retryPolicy.perAttemptRecvTimeout
    server_delays: int = 0                  # retries delayed as a server's google.rpc.RetryInfo asked


@dataclass(frozen=True)
class ThrottleState:
    """The channel's retry throttle (A6 "Throttling Retry Attempts and Hedged RPCs"), shared by every channel of
    the process to the same server name. Retries and hedges are sent while `tokens > threshold`."""

    tokens: float
    max_tokens: float
    threshold: float        # max_tokens / 2
    token_ratio: float      # tokens a success gives back (a failure takes 1)

    @property
    def retrying(self) -> bool:
        return self.tokens > self.threshold


def method_stats(policy: CallPolicy, now: float) -> MethodStats:
    s = policy.stats
    hedge = policy.hedge
    return MethodStats(
        calls=s.calls, attempts=s.attempts, retries=0 if policy.hedging else s.retries,
        hedges=s.retries if policy.hedging else 0,
        retry_attempts=s.retries, retry_attempts_failed=s.retries_failed, transparent_retries=s.transparent_retries,
        committed_by_overflow=s.committed_by_overflow, stopped_by_throttling=s.stopped_by_throttling,
        stopped_by_pushback=s.stopped_by_pushback, stopped_by_attempt_limit=s.stopped_by_attempt_limit,
        histogram=MappingProxyType(s.histogram()),
        hedging_delay=None if hedge is None else hedge.delay(now),
        hedges_not_sent_for_budget=0 if hedge is None else hedge.budget_stopped,
        attempts_timed_out=s.attempts_timed_out, server_delays=s.server_delays)


class ChannelStats(Mapping[str, MethodStats]):
    """What `retry_stats()` returns: per method with a retry or hedging policy, its MethodStats; and, for the
    channel's backends, `outlier_detection` (None unless the service config turns it on)."""

    __slots__ = ("_methods", "outlier_detection")

    def __init__(self, methods: Dict[str, MethodStats], outlier_detection: Optional[OutlierStats]) -> None:
        self._methods = MappingProxyType(methods)
        self.outlier_detection = outlier_detection

    def __getitem__(self, method: str) -> MethodStats:
        return self._methods[method]

    def __iter__(self) -> Iterator[str]:
        return iter(self._methods)

    def __len__(self) -> int:
        return len(self._methods)

    def __repr__(self) -> str:
        return f"ChannelStats({dict(self._methods)!r}, outlier_detection={self.outlier_detection!r})"


def channel_stats(policies: Dict[str, CallPolicy], outliers: Optional[OutlierStats] = None) -> ChannelStats:
    now = time.monotonic()
    return ChannelStats({method: method_stats(policy, now) for method, policy in list(policies.items())
                         if policy.max_attempts > 1}, outliers)


def throttle_state(throttle: Optional[RetryThrottle]) -> Optional[ThrottleState]:
    if throttle is None:
        return None
    return ThrottleState(tokens=throttle.tokens, max_tokens=throttle.max_milli_tokens / 1000.0,
                         threshold=throttle.max_milli_tokens / 2000.0,
                         token_ratio=throttle.milli_token_ratio / 1000.0)
