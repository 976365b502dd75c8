"""What one grpc_retry channel shares among its calls, sync or aio: options, per-method policies, the
channel-wide replay budget, the throttle of its server name, and the calls in flight (which close() ends)."""

from __future__ import annotations

import copy
import logging
import math
import random
import threading
import time
import weakref
from typing import Any, Collection, Dict, List, Optional, Set, Tuple

from grpc_retry._backends.outliers import OutlierStats
from grpc_retry._budget import budget_for
from grpc_retry._config import RetryPolicy, RetryThrottling
from grpc_retry._core import BufferPool, CallPolicy, HedgingControl, RetryThrottle
from grpc_retry._options import OptionsType, RetryOptions, parse_options
from grpc_retry._otel import observe_budget, observe_hedging, observe_outliers
from grpc_retry._stats import NO_POLICY, ChannelStats, MethodStats, channel_stats, method_stats
from grpc_retry._telemetry import Telemetry

log = logging.getLogger("grpc_retry")

_NO_RETRY = CallPolicy()

# A6: throttling is per server name, shared by every channel to it. Keyed by target and settings, so that a
# channel with other settings gets its own bucket.
_throttles: Dict[Tuple[str, int, int], RetryThrottle] = {}
_throttles_lock = threading.Lock()


def throttle_for(target: str, settings: Optional[RetryThrottling]) -> Optional[RetryThrottle]:
    if settings is None:
        return None
    key = (target, settings.max_milli_tokens, settings.milli_token_ratio)
    with _throttles_lock:
        throttle = _throttles.get(key)
        if throttle is None:
            throttle = _throttles[key] = RetryThrottle(settings.max_milli_tokens, settings.milli_token_ratio)
        return throttle


class ChannelState:
    __slots__ = ("target", "options", "pool", "throttle", "budget", "rng", "calls", "closed", "telemetry", "_policies",
                 "watches", "_route_policy", "routes", "_views", "__weakref__")

    def __init__(self, target: str, options: OptionsType) -> None:
        if not isinstance(target, str) or not target:
            raise ValueError(f"target must be a non-empty string, got {target!r}")
        self.target = target
        self.options: RetryOptions = parse_options(options)
        self.pool = BufferPool(self.options.channel_buffer)
        self.throttle = throttle_for(target, self.options.service_config.retry_throttling)
        self.budget = budget_for(target, self.options.retry_budget)
        self.telemetry = Telemetry(target, self.throttle, self.options.meter_provider, self.options.tracer_provider)
        self.rng = random.random
        # Calls whose attempts the channel does not run inline: each adds itself as it starts and removes itself
        # as it ends, exactly once.
        self.calls: Set[Any] = set()
        self.closed = False
        self._policies: Dict[str, CallPolicy] = {}
        self.watches: Dict[str, Any] = {}  # per hedged method: its HeadersWatch (the core's)
        self._route_policy: Optional[RetryPolicy] = None
        self.routes: Dict[RetryPolicy, ChannelState] = {}  # routed(): one view per retry policy of the routes
        self._views: weakref.WeakSet[ChannelState] = weakref.WeakSet()  # every view a call may hold, for close()
        if self._adaptive() and self.telemetry.meter_provider is not None:
            observe_hedging(self.telemetry.meter_provider, self)
        if self.budget is not None and self.telemetry.meter_provider is not None:
            observe_budget(self.telemetry.meter_provider, self)

    def routed(self, retry_policy: Optional[RetryPolicy]) -> ChannelState:
        """The channel as the calls of an xDS route see it: the route's retry policy (A44) in place of the service
        config's retry or hedging policy (None: the route gives none, the channel's own config applies); the same
        calls, buffer budget, throttle and telemetry."""
        if retry_policy is None:
            return self
        view = self.routes.get(retry_policy)
        if view is None:
            view = copy.copy(self)  # (the same objects: calls, pool, throttle, telemetry...)
            view._policies, view._route_policy, view.routes = {}, retry_policy, {}
            view = self.routes.setdefault(retry_policy, view)
            self._views.add(view)
        return view

    def keep_routes(self, policies: Collection[RetryPolicy]) -> None:
        """Drop the views of retry policies no route has any more (a call in flight keeps its own)."""
        for policy in [policy for policy in list(self.routes) if policy not in policies]:
            self.routes.pop(policy, None)  # (in place: a view another thread is adding stays)

    def close(self) -> None:
        self.closed = True
        for view in list(self._views):
            view.closed = True

    def observe_backends(self, subchannels: Any) -> None:
        """Export what the channel's backends do (outlier detection's ejections) when metrics are on."""
        if subchannels.outliers is not None and self.telemetry.meter_provider is not None:
            observe_outliers(self.telemetry.meter_provider, subchannels.outliers, self.telemetry.target)

    def _adaptive(self) -> bool:
        """Whether hedging policies get a HedgingControl: an adaptive delay, an extra-load budget, or both."""
        return self.options.hedging_quantile > 0 or self.options.max_extra_load >= 0

    def hedges(self) -> List[Tuple[str, HedgingControl]]:
        """Each method's adaptive hedging (its delay and budget), for methods called so far with a hedging policy."""
        return [(method, policy.hedge) for method, policy in self._every_policy() if policy.hedge is not None]

    def budget_refusals(self) -> List[Tuple[str, int]]:
        """Each method's calls whose retry or hedge the retry budget refused, for methods with a policy."""
        return [(method, policy.stats.refused_by_budget) for method, policy in self._every_policy()
                if policy.max_attempts > 1]

    def _every_policy(self) -> List[Tuple[str, CallPolicy]]:
        """Each method's policy, the routes' views' too (a method routed under two policies: the channel's first)."""
        policies = {method: policy for view in list(self.routes.values()) for method, policy in
                    list(view._policies.items())}
        policies.update(self._policies)
        return list(policies.items())

    def policy(self, method: str) -> CallPolicy:
        """The core's view of `method`'s config (cached: one parse per method and channel)."""
        policy = self._policies.get(method)
        if policy is None:
            policy = self._policies[method] = self._resolve(method)
        return policy

    def retry_stats(self, outliers: Optional[OutlierStats] = None) -> ChannelStats:
        """A snapshot of each method this channel has called with a retry or hedging policy."""
        if not self.options.enable_retries:
            uncovered = "grpc.enable_retries is 0"
        else:
            uncovered = NO_POLICY
            if self.target.startswith("xds:"):
                uncovered += ", and no call of it has taken an xDS route with a retry policy yet"
        return channel_stats(dict(self._every_policy()), outliers, self._uncalled_stats, uncovered)

    def _uncalled_stats(self, method: str) -> Optional[MethodStats]:
        """Zeros for a method that a retry or hedging policy covers but that has not been called yet, else None.
        Resolved, not cached: reading stats adds no method to them."""
        policy = self._resolve(method)
        return method_stats(policy, time.monotonic()) if policy.max_attempts > 1 else None

    def _resolve(self, method: str) -> CallPolicy:
        mc = self.options.service_config.method_config(method)
        if mc is None and self._route_policy is None:
            return _NO_RETRY
        timeout = math.inf if mc is None or mc.timeout is None else mc.timeout
        wait_for_ready = None if mc is None else mc.wait_for_ready
        rp = None if mc is None else mc.retry_policy
        hp = None if mc is None else mc.hedging_policy
        if self._route_policy is not None:
            rp, hp = self._route_policy, None
        if not self.options.enable_retries:
            rp = hp = None
        if hp is not None:
            options = self.options
            hedge = None
            if self._adaptive():
                hedge = HedgingControl(hp.hedging_delay, options.hedging_quantile, options.max_extra_load)
            return CallPolicy(max_attempts=hp.max_attempts, retryable_codes=hp.non_fatal_status_codes,
                              timeout=timeout, wait_for_ready=wait_for_ready, hedging_delay=hp.hedging_delay,
                              hedge=hedge, max_server_delay=options.max_server_delay)
        if rp is None:
            return CallPolicy(timeout=timeout, wait_for_ready=wait_for_ready)
        return CallPolicy(
            max_attempts=rp.max_attempts,
            initial_backoff=rp.initial_backoff,
            max_backoff=rp.max_backoff,
            backoff_multiplier=rp.backoff_multiplier,
            retryable_codes=rp.retryable_status_codes,
            timeout=timeout,
            wait_for_ready=wait_for_ready,
            recv_timeout=math.inf if rp.per_attempt_recv_timeout is None else rp.per_attempt_recv_timeout,
            max_server_delay=self.options.max_server_delay,
        )
