"""`RetryStrategy`, the backoff and `StandardRetryStrategy`: one decision generator, two thin loops."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Optional, TypeVar, cast

import grpc

from grpc_retry.strategy._bucket import StandardRetryTokenBucket
from grpc_retry.strategy._grpc import StandardRetryPolicy, _call_getter
from grpc_retry.strategy._types import (
    BackoffDelayer,
    CapacityUnavailable,
    Outcome,
    ResultRejectedError,
    RetryCapacityExceededError,
    RetryError,
    RetryPolicy,
    RetryTimeoutError,
    RetryToken,
    RetryTokenBucket,
    TerminateAndFail,
    TerminateAndSucceed,
    TooManyAttemptsError,
)

log = logging.getLogger("grpc_retry.strategy")

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


class RetryStrategy(ABC):
    """Runs a block at least once and retries it as a policy directs."""

    @abstractmethod
    def retry(self, policy: RetryPolicy[R], block: Callable[[], R]) -> R: ...

    @abstractmethod
    async def retry_async(self, policy: RetryPolicy[R], block: Callable[[], Awaitable[R]]) -> R: ...

    def retrying(self, policy: Optional[RetryPolicy[Any]] = None) -> Callable[[F], F]:
        """Decorator: each call of the function (sync or `async def`) runs through `retry` / `retry_async` with
        `policy` (default: `StandardRetryPolicy()`)."""
        if policy is not None and not hasattr(policy, "evaluate"):
            raise TypeError("retrying() takes a RetryPolicy: write @strategy.retrying() or @strategy.retrying(policy)")
        chosen: RetryPolicy[Any] = policy if policy is not None else StandardRetryPolicy()

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    return await self.retry_async(chosen, lambda: fn(*args, **kwargs))

                return cast(F, run_async)

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                return self.retry(chosen, lambda: fn(*args, **kwargs))

            return cast(F, run)

        return decorate


class ExponentialBackoff(BackoffDelayer):
    """Retry n waits up to `min(initial_delay * scale_factor**(n-1), max_delay)`; the fraction `jitter` of that is
    random. The default `jitter=1` is full jitter, `random(0, cap)`, the spread that keeps clients from retrying in
    step (and the formula A6 uses)."""

    def __init__(self, initial_delay: float = 0.1, scale_factor: float = 2.0, max_delay: float = 20.0,
                 jitter: float = 1.0, random: Callable[[], float] = random.random) -> None:
        if not (initial_delay >= 0 and scale_factor >= 1 and max_delay >= 0 and 0 <= jitter <= 1):
            raise ValueError("need initial_delay >= 0, scale_factor >= 1, max_delay >= 0 and 0 <= jitter <= 1")
        self.initial_delay, self.scale_factor = initial_delay, scale_factor
        self.max_delay, self.jitter = max_delay, jitter
        self._random = random

    def backoff(self, attempt: int) -> float:
        try:
            cap = min(self.initial_delay * self.scale_factor ** (attempt - 1), self.max_delay)
        except OverflowError:
            cap = self.max_delay
        return cap * (1.0 - self.jitter + self.jitter * self._random())


@dataclass(frozen=True)
class StandardRetryStrategyOptions:
    """`max_attempts`: tries in all, the first included. `max_time`: seconds from the start of `retry` after
    which no try starts and no wait is slept (None: no limit); a running try is not interrupted, so give each RPC
    its own timeout."""

    max_attempts: int = 3
    max_time: Optional[float] = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_attempts, int) and self.max_attempts >= 1):
            raise ValueError(f"max_attempts must be an int >= 1, not {self.max_attempts!r}")
        if self.max_time is not None and not self.max_time > 0:
            raise ValueError(f"max_time must be > 0 seconds or None, not {self.max_time!r}")


_RUN = object()  # what _plan yields to have the block run


class StandardRetryStrategy(RetryStrategy):
    """Tries a block up to `options.max_attempts` times within `options.max_time`. Before a retry it waits for the
    backoff (or the server's pushback), then takes the retry's cost from the token bucket. `clock`, `sleep` and
    `async_sleep` are injectable (tests pass fakes; `clock` must agree with the bucket's)."""

    def __init__(self, options: Optional[StandardRetryStrategyOptions] = None,
                 token_bucket: Optional[RetryTokenBucket] = None, backoff_delayer: Optional[BackoffDelayer] = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Any] = time.sleep,
                 async_sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.options = options if options is not None else StandardRetryStrategyOptions()
        self.token_bucket = token_bucket if token_bucket is not None else StandardRetryTokenBucket(clock=clock)
        self.backoff_delayer = backoff_delayer if backoff_delayer is not None else ExponentialBackoff()
        self._clock, self._sleep, self._async_sleep = clock, sleep, async_sleep

    def retry(self, policy: RetryPolicy[R], block: Callable[[], R]) -> R:
        """Run `block` until `policy` says to stop; return its value or raise (see `_plan`)."""
        plan = self._plan(policy)
        try:
            step = next(plan)
            while True:
                if step is _RUN:
                    try:
                        outcome: Outcome[Any] = Outcome(block())
                    except Exception as e:
                        outcome = Outcome(exception=e)
                    step = plan.send(outcome)
                else:
                    self._sleep(cast(float, step))
                    step = next(plan)
        except StopIteration as stop:
            final: Outcome[R] = stop.value
        finally:
            plan.close()  # on an escaping BaseException: resolves the token as a failure
        return final.get()

    async def retry_async(self, policy: RetryPolicy[R], block: Callable[[], Awaitable[R]]) -> R:
        """As `retry`, for a block that returns an awaitable (an `async def` function, a grpc.aio call)."""
        plan = self._plan(policy)
        try:
            step = next(plan)
            while True:
                if step is _RUN:
                    try:
                        outcome: Outcome[Any] = Outcome(await block())
                    except Exception as e:
                        outcome = Outcome(exception=e)
                    step = plan.send(outcome)
                else:
                    await self._async_sleep(cast(float, step))
                    step = next(plan)
        except StopIteration as stop:
            final: Outcome[R] = stop.value
        finally:
            plan.close()
        return final.get()

    def _plan(self, policy: RetryPolicy[Any]) -> Generator[object, Outcome[Any], Outcome[Any]]:
        """The decisions of one `retry`. Returns the outcome to deliver (the value, or the block's own exception
        on `TerminateAndFail`); raises `TooManyAttemptsError`, `RetryTimeoutError`, `RetryCapacityExceededError`
        or `ResultRejectedError`. Whatever happens, the current token is resolved exactly once."""
        options, clock = self.options, self._clock
        deadline = None if options.max_time is None else clock() + options.max_time
        attempt = 0
        backoff_step = 0  # consecutive failures since the start or the last pushback
        token: Optional[RetryToken] = None
        try:
            token = yield from self._capacity(self.token_bucket.acquire_token, deadline, None, 0)
            while True:
                attempt += 1
                outcome = yield _RUN
                directive = policy.evaluate(outcome)
                log.debug("try %d %s: %r", attempt, _describe(outcome), directive)
                if directive is TerminateAndSucceed:
                    done, token = token, None
                    done.notify_success()
                    return Outcome(outcome.value)  # a failure the policy accepts returns None
                if directive is TerminateAndFail:
                    if outcome.failed:
                        return outcome
                    raise ResultRejectedError(f"the policy rejected the result of try {attempt}", outcome, attempt)
                if not isinstance(directive, RetryError):
                    raise TypeError(f"{type(policy).__name__}.evaluate returned {directive!r}, not a RetryDirective")
                if attempt >= options.max_attempts:
                    raise TooManyAttemptsError(f"gave up after {attempt} attempts: {_describe(outcome)}",
                                               outcome, attempt)
                if directive.delay is not None:
                    delay, backoff_step = directive.delay, 0
                else:
                    backoff_step += 1
                    delay = self.backoff_delayer.backoff(backoff_step)
                if deadline is not None and clock() + delay >= deadline:
                    raise RetryTimeoutError(f"no time left for a retry after {attempt} attempts: "
                                            f"{_describe(outcome)}", outcome, attempt)
                log.debug("retry %d in %.3fs (%s)", attempt + 1, delay, directive.reason.name)
                if delay > 0:
                    yield delay
                retry = functools.partial(token.schedule_retry, directive.reason)
                token = yield from self._capacity(retry, deadline, outcome, attempt)
        finally:
            if token is not None:
                token.notify_failure()

    def _capacity(self, take: Callable[[], RetryToken], deadline: Optional[float], outcome: Optional[Outcome[Any]],
                  attempts: int) -> Generator[float, Any, RetryToken]:
        """A token from `take()`, sleeping while the bucket says to wait (its blocking mode)."""
        while True:
            try:
                return take()
            except CapacityUnavailable as empty:
                wait = empty.retry_after
            if wait is None:
                raise RetryCapacityExceededError(f"no retry capacity after {attempts} attempts", outcome, attempts)
            if deadline is not None and self._clock() + wait >= deadline:
                raise RetryTimeoutError(f"no time left to wait for retry capacity after {attempts} attempts",
                                        outcome, attempts)
            log.debug("waiting %.3fs for retry capacity", wait)
            yield wait


def _describe(outcome: Outcome[Any]) -> str:
    if not outcome.failed:
        return "returned"
    error = outcome.exception
    code = _call_getter(error, "code") if isinstance(error, grpc.RpcError) else None
    return f"failed: {code}" if code is not None else f"failed: {type(error).__name__}"
