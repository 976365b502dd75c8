"""What `channel.retry_stats()` and `channel.throttle` return: immutable snapshots, taken when asked for.
`print()` shows a ChannelStats as a short table, one row per method, and a MethodStats as a few lines."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Mapping, Optional

if TYPE_CHECKING:
    from grpc_retry._backends.outliers import OutlierStats
    from grpc_retry._core import CallPolicy, RetryThrottle

# A6's histogram buckets, as the core names them; and which retry (or hedge) of its call each one holds.
HISTOGRAM_BUCKETS = (">=1", ">=2", ">=3", ">=4", ">=5", ">=10", ">=100", ">=1000")
_BUCKET_NAMES = dict(zip(HISTOGRAM_BUCKETS, ("1st", "2nd", "3rd", "4th", "5th-9th", "10th-99th", "100th-999th",
                                             "1000th+"), strict=True))


def _no_retries() -> Mapping[str, int]:
    return MappingProxyType(dict.fromkeys(HISTOGRAM_BUCKETS, 0))


@dataclass(frozen=True, repr=False)
class MethodStats:
    """One method's calls since the channel was made (A6 "Retry and Hedging Statistics", and more). Every count
    starts at 0; `print()` shows it in a few lines, `repr()` leaves out the counts that are still 0.

    A6's own counters: the retry attempts (here `retries + hedges`: every attempt after a call's first counted
    one), `retry_attempts_failed`, and `histogram`, which is not cumulative: each retry (or hedge) counts once, in
    the bucket of the largest threshold its number reached. ">=1" counts first retries, ">=2" second retries,
    ... ">=5" the 5th to 9th, ">=10" the 10th to 99th, and so on; the buckets add up to `retries + hedges`."""

    calls: int = 0                      # logical calls ended
    attempts: int = 0                   # grpcio calls made for them, transparent retries included
    retries: int = 0                    # attempts after the first under a retry policy
    hedges: int = 0                     # attempts after the first under a hedging policy
    retry_attempts_failed: int = 0      # A6: of the retries and hedges, the ones that failed
    transparent_retries: int = 0        # attempts the server's application never saw, sent again
    committed_by_overflow: int = 0      # calls that committed because the replay buffer was full
    stopped_by_throttling: int = 0      # calls that ended failed because throttling stopped their next attempt
    stopped_by_pushback: int = 0        # ... because the server's pushback said not to retry
    stopped_by_attempt_limit: int = 0   # ... because maxAttempts was reached
    histogram: Mapping[str, int] = field(default_factory=_no_retries)  # not cumulative: see above
    hedging_delay: Optional[float] = None   # adaptive hedging: seconds before the next hedge, now
    hedges_not_sent_for_budget: int = 0     # hedges due but over `grpc_retry.max_extra_load`
    attempts_timed_out: int = 0             # attempts cancelled by retryPolicy.perAttemptRecvTimeout
    server_delays: int = 0                  # retries delayed as a server's google.rpc.RetryInfo asked
    refused_by_budget: int = 0              # calls whose retry or hedge `grpc_retry.retry_budget` did not allow

    @property
    def retry_attempts(self) -> int:
        """Deprecated: use `retries + hedges` (one of the two is always 0). A6's "retry attempts": every attempt
        after a call's first counted one."""
        warnings.warn("MethodStats.retry_attempts is deprecated: use retries + hedges (one of them is always 0)",
                      DeprecationWarning, stacklevel=2)
        return self.retries + self.hedges

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "histogram":
                value = {bucket: count for bucket, count in value.items() if count}
                if value:
                    shown.append(f"histogram={value!r}")
            elif value != f.default:
                shown.append(f"{f.name}={value!r}")
        return f"MethodStats({', '.join(shown)})"

    def __str__(self) -> str:
        failed = f" ({self.retry_attempts_failed} failed)"  # A6 counts the failures of retries and hedges alike
        which = ", ".join(f"{_BUCKET_NAMES.get(bucket, bucket)} {count}" for bucket, count in self.histogram.items()
                          if count)
        lines = [f"{_n(self.calls, 'call')}, {_n(self.attempts, 'attempt')}: "
                 f"{_n(self.retries, 'retry')}{'' if self.hedges else failed}, "
                 f"{_n(self.hedges, 'hedge')}{failed if self.hedges else ''}, "
                 f"{_n(self.transparent_retries, 'transparent retry')}",
                 f"calls stopped by throttling {self.stopped_by_throttling}, by pushback {self.stopped_by_pushback}, "
                 f"at max attempts {self.stopped_by_attempt_limit}; committed by buffer overflow "
                 f"{self.committed_by_overflow}",
                 f"histogram (each {'hedge' if self.hedges else 'retry'} counted once, by its number in its call): "
                 f"{which or 'empty'}"]
        if self.attempts_timed_out or self.server_delays:
            lines.append(f"attempts timed out {self.attempts_timed_out}, "
                         f"retries delayed by the server's RetryInfo {self.server_delays}")
        if self.refused_by_budget:
            lines.append(f"calls whose retry or hedge the retry budget refused {self.refused_by_budget}")
        if self.hedging_delay is not None:
            lines.append(f"hedging delay now {self.hedging_delay * 1000:.1f} ms, "
                         f"hedges not sent for max_extra_load {self.hedges_not_sent_for_budget}")
        return "\n".join(lines)


def _n(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1]}ies" if noun.endswith("y") else f"{count} {noun}s"


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
        retry_attempts_failed=s.retries_failed, transparent_retries=s.transparent_retries,
        committed_by_overflow=s.committed_by_overflow, stopped_by_throttling=s.stopped_by_throttling,
        stopped_by_pushback=s.stopped_by_pushback, stopped_by_attempt_limit=s.stopped_by_attempt_limit,
        histogram=MappingProxyType(s.histogram()),
        hedging_delay=None if hedge is None else hedge.delay(now),
        hedges_not_sent_for_budget=0 if hedge is None else hedge.budget_stopped,
        attempts_timed_out=s.attempts_timed_out, server_delays=s.server_delays,
        refused_by_budget=s.refused_by_budget)


# The table's count columns: header, MethodStats field. "throttled": calls stopped by the retry throttle.
_COLUMNS = (("calls", "calls"), ("attempts", "attempts"), ("retries", "retries"), ("hedges", "hedges"),
            ("transparent", "transparent_retries"), ("throttled", "stopped_by_throttling"))
# Its "outcomes" column: the other ways a call's retries ended, the ones that happened.
_OUTCOMES = (("max attempts", "stopped_by_attempt_limit"), ("pushback", "stopped_by_pushback"),
             ("overflow", "committed_by_overflow"), ("retry budget", "refused_by_budget"))
# Why a method has no stats, as the KeyError words it, when nothing more precise is known.
NO_POLICY = "the service config gives it no retryPolicy or hedgingPolicy"


class ChannelStats(Mapping[str, MethodStats]):
    """What `retry_stats()` returns: per method called with a retry or hedging policy, its MethodStats; and, for
    the channel's backends, `outlier_detection` (None unless the service config turns it on).

    Iterating lists the methods called so far. Indexing also answers a method that a retry or hedging policy
    covers but that has not been called yet (a MethodStats of zeros); any other name raises a KeyError that says
    why. `print()` shows a table, one row per method."""

    __slots__ = ("_methods", "outlier_detection", "_uncalled", "_uncovered")

    def __init__(self, methods: Dict[str, MethodStats], outlier_detection: Optional[OutlierStats],
                 uncalled: Optional[Callable[[str], Optional[MethodStats]]] = None,
                 uncovered: str = NO_POLICY) -> None:
        self._methods = MappingProxyType(methods)
        self.outlier_detection = outlier_detection
        self._uncalled = uncalled    # zeros for a method a policy covers, None for one none does
        self._uncovered = uncovered  # why a method no policy covers has none, for the KeyError

    def __getitem__(self, method: str) -> MethodStats:
        stats = self._methods.get(method)
        if stats is None and self._uncalled is not None and isinstance(method, str):
            stats = self._uncalled(method)
        if stats is None:
            raise KeyError(self._missing(method))
        return stats

    def _missing(self, method: object) -> str:
        listed = ", ".join(repr(name) for name in self._methods) or "none yet"
        message = (f"no retry stats for {method!r}: no retry or hedging policy covers it on this channel "
                   f"({self._uncovered}); methods with stats: {listed}")
        if not isinstance(method, str) or not method.startswith("/") or method.count("/") != 2:
            message += "; a method's name looks like '/package.Service/Method'"
        return message

    def __iter__(self) -> Iterator[str]:
        return iter(self._methods)

    def __len__(self) -> int:
        return len(self._methods)

    def __repr__(self) -> str:
        return f"ChannelStats({dict(self._methods)!r}, outlier_detection={self.outlier_detection!r})"

    def __str__(self) -> str:
        lines = _table(self._methods) if self._methods else ["no calls with a retry or hedging policy yet"]
        if self.outlier_detection is not None:
            lines += _outliers(self.outlier_detection)
        return "\n".join(lines)


def _table(methods: Mapping[str, MethodStats]) -> List[str]:
    """One row per method: its name, the counts right-aligned under their headers, then its outcomes."""
    rows = [["method", *(header for header, _ in _COLUMNS), "outcomes"]]
    for method, stats in methods.items():
        outcomes = ", ".join(f"{name} {getattr(stats, key)}" for name, key in _OUTCOMES if getattr(stats, key))
        rows.append([method, *(str(getattr(stats, key)) for _, key in _COLUMNS), outcomes or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        counts = " ".join(cell.rjust(width) for cell, width in zip(row[1:-1], widths[1:-1], strict=True))
        lines.append(f"{row[0].ljust(widths[0])}  {counts}  {row[-1]}".rstrip())
    return lines


def _outliers(stats: OutlierStats) -> List[str]:
    """Two lines: the ejections so far, by kind; the backends ejected now."""
    by_kind = (f"success rate {stats.ejections_enforced_success_rate}, "
               f"failure percentage {stats.ejections_enforced_failure_percentage}")
    now = f"  ejected now: {', '.join(stats.ejected) or 'none'}"
    if stats.ejections_overflow:  # detected, but maxEjectionPercent kept them in
        now += f"; outliers left in for maxEjectionPercent: {stats.ejections_overflow}"
    return [f"outlier detection: {_n(stats.ejections_enforced_total, 'ejection')} ({by_kind}), "
            f"{stats.unejections} returned", now]


def channel_stats(policies: Dict[str, CallPolicy], outliers: Optional[OutlierStats] = None,
                  uncalled: Optional[Callable[[str], Optional[MethodStats]]] = None,
                  uncovered: str = NO_POLICY) -> ChannelStats:
    now = time.monotonic()
    return ChannelStats({method: method_stats(policy, now) for method, policy in list(policies.items())
                         if policy.max_attempts > 1}, outliers, uncalled, uncovered)


def throttle_state(throttle: Optional[RetryThrottle]) -> Optional[ThrottleState]:
    if throttle is None:
        return None
    return ThrottleState(tokens=throttle.tokens, max_tokens=throttle.max_milli_tokens / 1000.0,
                         threshold=throttle.max_milli_tokens / 2000.0,
                         token_ratio=throttle.milli_token_ratio / 1000.0)
