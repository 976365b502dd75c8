"""The standard token bucket: retries cost capacity by error type, successes give it back, time refills it."""

from __future__ import annotations

import threading
import time
from types import MappingProxyType
from typing import Callable, Mapping, Optional

from grpc_retry.strategy._types import CapacityUnavailable, RetryErrorType, RetryToken, RetryTokenBucket

DEFAULT_RETRY_COSTS: Mapping[RetryErrorType, float] = MappingProxyType({
    RetryErrorType.SERVER_SIDE: 5,
    RetryErrorType.CLIENT_SIDE: 5,
    RetryErrorType.THROTTLING: 10,  # a server that asks for less load gets retried more slowly
    RetryErrorType.TIMEOUT: 10,  # a timed-out try may still be running on the server
})

_EPSILON = 1e-9  # refill is float arithmetic on clock differences: forgive rounding when comparing capacity


class StandardRetryTokenBucket(RetryTokenBucket):
    """A bucket of `max_capacity` units, full at first, refilled at `refill_per_second` whatever happens.

    A first try costs `initial_try_cost` and, if it succeeds, adds `initial_try_success_increment`; a retry costs
    `retry_costs[reason]` and, if it succeeds, refunds that cost; a failure gives nothing back. With too little
    capacity a retry fails at once (`block=False`, a circuit breaker) or waits for the refill (`block=True`).
    Thread-safe: share one bucket among the operations that load the same service."""

    def __init__(self, *, max_capacity: float = 500, refill_per_second: float = 10,
                 retry_costs: Optional[Mapping[RetryErrorType, float]] = None, initial_try_cost: float = 0,
                 initial_try_success_increment: float = 1, block: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        costs = dict(DEFAULT_RETRY_COSTS)
        costs.update(retry_costs or {})
        if not (max_capacity >= 0 and refill_per_second >= 0 and initial_try_cost >= 0
                and initial_try_success_increment >= 0 and all(c >= 0 for c in costs.values())):
            raise ValueError("token bucket capacities, costs and rates must be >= 0")
        self.max_capacity, self.refill_per_second, self.block = max_capacity, refill_per_second, block
        self.retry_costs: Mapping[RetryErrorType, float] = MappingProxyType(costs)
        self.initial_try_cost, self.initial_try_success_increment = initial_try_cost, initial_try_success_increment
        self._clock = clock
        self._lock = threading.Lock()
        self._capacity = float(max_capacity)
        self._stamp = clock()

    @property
    def capacity(self) -> float:
        """The capacity now, refill included."""
        with self._lock:
            self._refill()
            return self._capacity

    def acquire_token(self) -> RetryToken:
        self._take(self.initial_try_cost)
        return _StandardRetryToken(self, self.initial_try_success_increment)

    def _refill(self) -> None:
        now = self._clock()
        if now > self._stamp:
            self._capacity = min(self.max_capacity, self._capacity + (now - self._stamp) * self.refill_per_second)
        self._stamp = now

    def _take(self, cost: float) -> None:
        with self._lock:
            self._refill()
            if self._capacity + _EPSILON >= cost:
                self._capacity = max(0.0, self._capacity - cost)
                return
            short = cost - self._capacity
        if self.block and self.refill_per_second > 0 and cost <= self.max_capacity:
            raise CapacityUnavailable(short / self.refill_per_second)
        raise CapacityUnavailable(None)

    def _give(self, amount: float) -> None:
        with self._lock:
            self._refill()
            self._capacity = min(self.max_capacity, self._capacity + amount)


class _StandardRetryToken(RetryToken):
    __slots__ = ("_bucket", "_refund", "_resolved")

    def __init__(self, bucket: StandardRetryTokenBucket, refund: float) -> None:
        self._bucket, self._refund, self._resolved = bucket, refund, False

    def _resolve(self) -> None:
        if self._resolved:
            raise RuntimeError("retry token already resolved")
        self._resolved = True

    def notify_success(self) -> None:
        self._resolve()
        self._bucket._give(self._refund)

    def notify_failure(self) -> None:
        self._resolve()

    def schedule_retry(self, reason: RetryErrorType) -> RetryToken:
        if self._resolved:
            raise RuntimeError("retry token already resolved")
        cost = self._bucket.retry_costs[reason]
        self._bucket._take(cost)  # CapacityUnavailable leaves this token unresolved
        self._resolved = True
        return _StandardRetryToken(self._bucket, cost)
