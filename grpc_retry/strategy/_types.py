"""The vocabulary of the design: outcomes, directives, errors, and the interfaces a strategy is built from."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, Optional, TypeVar, cast

R = TypeVar("R")


class RetryErrorType(enum.Enum):
    """Why a try failed, as retrying sees it. Token buckets price a retry by it."""

    SERVER_SIDE = "server_side"  # the server failed or could not be reached
    CLIENT_SIDE = "client_side"  # the request failed in a way the client can cure by trying again (a conflict)
    THROTTLING = "throttling"  # the server asked the client to slow down
    TIMEOUT = "timeout"  # the try ran out of time


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """The result of one try: the value it returned, or the exception it raised (the seed's `Result<R>`)."""

    value: Optional[R] = None
    exception: Optional[BaseException] = None

    @property
    def failed(self) -> bool:
        return self.exception is not None

    def get(self) -> R:
        """The value, or raise the exception."""
        if self.exception is not None:
            raise self.exception
        return cast(R, self.value)


class RetryDirective:
    """What a policy tells the strategy to do with an outcome: `TerminateAndSucceed`, `TerminateAndFail` (both
    singletons, compare with `is`) or a `RetryError` instance."""

    __slots__ = ()


class _Terminate(RetryDirective):
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name  # copies and pickles stay the module's singleton


TerminateAndSucceed: RetryDirective = _Terminate("TerminateAndSucceed")
TerminateAndFail: RetryDirective = _Terminate("TerminateAndFail")


@dataclass(frozen=True)
class RetryError(RetryDirective):
    """Directive (not an exception, the name is the design's): the try failed for `reason`, retry it.

    `delay`, in seconds, replaces the backoff before this one retry (server pushback); the backoff sequence then
    starts over, as A6 says."""

    reason: RetryErrorType
    delay: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.reason, RetryErrorType):
            raise TypeError(f"reason must be a RetryErrorType, not {self.reason!r}")
        if self.delay is not None and not self.delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, not {self.delay!r}")


# -- errors ---------------------------------------------------------------------------------------------------


class RetryStrategyError(Exception):
    """The strategy gave up. `outcome` is the last try's outcome (None if no try ran), `attempts` the number of
    tries made; the last try's exception is also the `__cause__`."""

    __module__ = "grpc_retry.strategy"  # tracebacks name the errors as applications import them (pickle too)

    def __init__(self, message: str, outcome: Optional[Outcome[Any]] = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.attempts = attempts
        if outcome is not None and outcome.exception is not None:
            self.__cause__ = outcome.exception


class TooManyAttemptsError(RetryStrategyError):
    """Every one of `max_attempts` tries failed with a retryable error."""

    __module__ = "grpc_retry.strategy"


class RetryTimeoutError(RetryStrategyError):
    """The total time limit would pass before the next try could start."""

    __module__ = "grpc_retry.strategy"


class RetryCapacityExceededError(RetryStrategyError):
    """The token bucket had no capacity for the next try, and was not set to wait for it."""

    __module__ = "grpc_retry.strategy"


class ResultRejectedError(RetryStrategyError):
    """The policy answered `TerminateAndFail` to a try that returned a value (there is no exception to raise)."""

    __module__ = "grpc_retry.strategy"


class CapacityUnavailable(Exception):
    """Raised by a token bucket that cannot grant a token now. `retry_after`: seconds until it can (the strategy
    sleeps that long and asks again), or None: the strategy fails at once."""

    __module__ = "grpc_retry.strategy"

    def __init__(self, retry_after: Optional[float] = None) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


# -- the interfaces of the design -----------------------------------------------------------------------------


class RetryPolicy(ABC, Generic[R]):
    """Judges the outcome of a try."""

    @abstractmethod
    def evaluate(self, outcome: Outcome[R]) -> RetryDirective: ...


class RetryToken(ABC):
    """Permission for one try. The strategy resolves each token exactly once, by one of these three methods (a
    `schedule_retry` that raises `CapacityUnavailable` resolves nothing)."""

    @abstractmethod
    def notify_success(self) -> None: ...

    @abstractmethod
    def notify_failure(self) -> None: ...

    @abstractmethod
    def schedule_retry(self, reason: RetryErrorType) -> RetryToken:
        """The token for the next try; raises `CapacityUnavailable` when the bucket cannot pay for it."""


class RetryTokenBucket(ABC):
    """Rations tries. The strategy calls `acquire_token` before the first try of a block."""

    @abstractmethod
    def acquire_token(self) -> RetryToken:
        """The token for a first try; raises `CapacityUnavailable` when the bucket cannot grant it."""


class BackoffDelayer(ABC):
    """Says how long to wait before a retry. It only computes; the strategy's loop sleeps, so that one delayer
    serves sync and asyncio alike."""

    @abstractmethod
    def backoff(self, attempt: int) -> float:
        """Seconds to wait after the `attempt`-th consecutive failure (counted from 1, and from the last pushback)."""
