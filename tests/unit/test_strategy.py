"""grpc_retry.strategy alone: a fake clock, fixed randomness and recorded sleeps; nothing really waits.

Behavioural tests take the `run` fixture and so run through both loops, `retry` and `retry_async`.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import pickle

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpc_retry.strategy import (
    DEFAULT_RETRY_COSTS,
    CapacityUnavailable,
    ExponentialBackoff,
    Outcome,
    ResultRejectedError,
    RetryCapacityExceededError,
    RetryError,
    RetryErrorType,
    RetryPolicy,
    RetryStrategyError,
    RetryTimeoutError,
    RetryToken,
    RetryTokenBucket,
    StandardRetryPolicy,
    StandardRetryStrategy,
    StandardRetryStrategyOptions,
    StandardRetryTokenBucket,
    TerminateAndFail,
    TerminateAndSucceed,
    TooManyAttemptsError,
)

Code = grpc.StatusCode
SERVER, CLIENT, THROTTLING, TIMEOUT = (RetryErrorType.SERVER_SIDE, RetryErrorType.CLIENT_SIDE,
                                       RetryErrorType.THROTTLING, RetryErrorType.TIMEOUT)
PUSHBACK = "grpc-retry-pushback-ms"


# -- fakes ----------------------------------------------------------------------------------------------------


class FakeTime:
    """A clock that moves only when a sleep or a try says so; records every sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


class FakeRpcError(grpc.RpcError):
    """What grpcio raises, reduced to what a policy reads."""

    def __init__(self, code: grpc.StatusCode, trailing=()):
        super().__init__(code)
        self._code, self._trailing = code, tuple(trailing)

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self):
        return self._trailing


def rpc(code=Code.UNAVAILABLE, pushback=None) -> FakeRpcError:
    return FakeRpcError(code, () if pushback is None else ((PUSHBACK, pushback),))


class Block:
    """An operation that raises its scripted exceptions in turn, then returns "done". Each try may take
    `duration` seconds of the fake clock and may run `during(try_number)`."""

    def __init__(self, *steps, clock: FakeTime | None = None, duration: float = 0.0, during=None):
        self.steps, self.calls, self.clock, self.duration, self.during = list(steps), 0, clock, duration, during

    def __call__(self):
        self.calls += 1
        if self.clock is not None:
            self.clock.now += self.duration
        if self.during is not None:
            self.during(self.calls)
        step = self.steps.pop(0) if self.steps else "done"
        if isinstance(step, BaseException):
            raise step
        return step

    async def run_async(self):
        await asyncio.sleep(0)  # a real suspension point, as an RPC would have
        return self()


class RecordingBucket(RetryTokenBucket):
    """Wraps a bucket and logs each call of the token protocol into a shared event list."""

    def __init__(self, inner: RetryTokenBucket, events: list):
        self.inner, self.events = inner, events

    def acquire_token(self) -> RetryToken:
        self.events.append("acquire")
        return RecordingToken(self.inner.acquire_token(), self.events)


class RecordingToken(RetryToken):
    def __init__(self, inner: RetryToken, events: list):
        self.inner, self.events = inner, events

    def notify_success(self) -> None:
        self.events.append("success")
        self.inner.notify_success()

    def notify_failure(self) -> None:
        self.events.append("failure")
        self.inner.notify_failure()

    def schedule_retry(self, reason: RetryErrorType) -> RetryToken:
        self.events.append(f"retry {reason.name}")
        return RecordingToken(self.inner.schedule_retry(reason), self.events)


HALF = ExponentialBackoff(1.0, 2.0, 5.0, random=lambda: 0.5)  # delays 0.5, 1, 2, 2.5, 2.5, ...


def strategy(t: FakeTime, max_attempts=3, max_time=None, bucket=None, backoff=HALF) -> StandardRetryStrategy:
    bucket = bucket if bucket is not None else StandardRetryTokenBucket(clock=t, refill_per_second=0)
    return StandardRetryStrategy(StandardRetryStrategyOptions(max_attempts, max_time), bucket, backoff,
                                 clock=t, sleep=t.sleep, async_sleep=t.async_sleep)


@pytest.fixture(params=["sync", "async"])
def run(request):
    """run(strategy, policy, block): through `retry` or `retry_async`."""

    async def run(s: StandardRetryStrategy, policy: RetryPolicy, block: Block):
        if request.param == "sync":
            return s.retry(policy, block)
        return await s.retry_async(policy, block.run_async)

    return run


POLICY = StandardRetryPolicy()


# -- StandardRetryPolicy ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, reason", [(Code.UNAVAILABLE, SERVER), (Code.RESOURCE_EXHAUSTED, THROTTLING),
                                          (Code.DEADLINE_EXCEEDED, TIMEOUT), (Code.ABORTED, CLIENT)])
def test_policy_retries_transient_codes_by_type(code, reason):
    assert POLICY.evaluate(Outcome(exception=rpc(code))) == RetryError(reason)


@pytest.mark.parametrize("code", [Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.ALREADY_EXISTS, Code.PERMISSION_DENIED,
                                  Code.UNAUTHENTICATED, Code.FAILED_PRECONDITION, Code.OUT_OF_RANGE,
                                  Code.UNIMPLEMENTED, Code.CANCELLED, Code.INTERNAL, Code.UNKNOWN, Code.DATA_LOSS])
def test_policy_fails_on_client_side_and_unsafe_codes(code):
    assert POLICY.evaluate(Outcome(exception=rpc(code))) is TerminateAndFail


@pytest.mark.parametrize("value", ["reply", None, 0])
def test_policy_succeeds_on_any_value(value):
    assert POLICY.evaluate(Outcome(value)) is TerminateAndSucceed


@pytest.mark.parametrize("raw, seconds", [("250", 0.25), ("0", 0.0), (b"40", 0.04), ("2147483647", 2147483.647)])
def test_policy_honours_pushback_delay(raw, seconds):
    assert POLICY.evaluate(Outcome(exception=rpc(pushback=raw))) == RetryError(SERVER, seconds)


@pytest.mark.parametrize("raw", ["-1", "-250", "abc", "", "007", "1.5", " 5", "2147483648", "\u0663", "9" * 5000])
def test_policy_stops_on_negative_or_malformed_pushback(raw):
    assert POLICY.evaluate(Outcome(exception=rpc(pushback=raw))) is TerminateAndFail


def test_policy_stops_on_repeated_pushback():
    error = FakeRpcError(Code.UNAVAILABLE, ((PUSHBACK, "5"), ("other", "x"), (PUSHBACK, "5")))
    assert POLICY.evaluate(Outcome(exception=error)) is TerminateAndFail


def test_pushback_does_not_make_a_non_retryable_code_retryable():
    assert POLICY.evaluate(Outcome(exception=rpc(Code.INVALID_ARGUMENT, pushback="10"))) is TerminateAndFail


def test_policy_can_ignore_pushback():
    policy = StandardRetryPolicy(pushback=False)
    assert policy.evaluate(Outcome(exception=rpc(pushback="-1"))) == RetryError(SERVER)
    assert policy.evaluate(Outcome(exception=rpc(pushback="300"))) == RetryError(SERVER)


def test_policy_takes_its_own_status_codes():
    policy = StandardRetryPolicy({Code.UNAVAILABLE: THROTTLING})
    assert policy.evaluate(Outcome(exception=rpc(Code.UNAVAILABLE))) == RetryError(THROTTLING)
    assert policy.evaluate(Outcome(exception=rpc(Code.DEADLINE_EXCEEDED))) is TerminateAndFail


@pytest.mark.parametrize("error, expected", [
    (TimeoutError("t"), RetryError(TIMEOUT)),
    (asyncio.TimeoutError(), RetryError(TIMEOUT)),
    (ConnectionResetError("reset"), RetryError(SERVER)),
    (ValueError("bug"), TerminateAndFail),
    (grpc.RpcError(), TerminateAndFail),  # no code() at all
    (TooManyAttemptsError("inner strategy gave up"), TerminateAndFail),  # nested strategies do not compound
])
def test_policy_classifies_other_exceptions(error, expected):
    assert POLICY.evaluate(Outcome(exception=error)) == expected


class Overloaded(Exception):
    pass


class AppPolicy(StandardRetryPolicy):
    def evaluate_other_exceptions(self, error):
        if isinstance(error, Overloaded):
            return RetryError(THROTTLING)
        if isinstance(error, grpc.RpcError) and error.code() is Code.INTERNAL:
            return RetryError(SERVER)
        if isinstance(error, grpc.RpcError):
            return TerminateAndSucceed  # must never be asked about codes the standard tier answers
        return None


def test_subclass_classifies_what_the_standard_tiers_leave():
    policy = AppPolicy()
    assert policy.evaluate(Outcome(exception=Overloaded())) == RetryError(THROTTLING)
    assert policy.evaluate(Outcome(exception=rpc(Code.INTERNAL))) == RetryError(SERVER)
    assert policy.evaluate(Outcome(exception=rpc(Code.UNAVAILABLE))) == RetryError(SERVER)
    assert policy.evaluate(Outcome(exception=KeyError("x"))) is TerminateAndFail


def test_directives_are_validated_and_singletons_survive_copies():
    with pytest.raises(TypeError):
        RetryError("ServerSide")
    with pytest.raises(ValueError):
        RetryError(SERVER, -0.5)
    assert copy.deepcopy(TerminateAndFail) is TerminateAndFail
    assert pickle.loads(pickle.dumps(TerminateAndSucceed)) is TerminateAndSucceed
    assert repr(TerminateAndSucceed) == "TerminateAndSucceed"
    assert RetryError(SERVER, 0.25) != RetryError(SERVER)


# -- ExponentialBackoff -----------------------------------------------------------------------------------------


def test_backoff_is_exponential_with_full_jitter_and_capped():
    assert [HALF.backoff(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 2.5, 2.5, 2.5]
    assert [ExponentialBackoff(1.0, 2.0, 5.0, random=lambda: 0.0).backoff(n) for n in (1, 4)] == [0.0, 0.0]


def test_backoff_jitter_fraction():
    none = ExponentialBackoff(1.0, 2.0, 5.0, jitter=0.0, random=lambda: 0.0)
    assert [none.backoff(n) for n in range(1, 5)] == [1.0, 2.0, 4.0, 5.0]
    quarter = ExponentialBackoff(4.0, 2.0, 100.0, jitter=0.25, random=lambda: 0.5)
    assert quarter.backoff(1) == 3.5  # 4 * (0.75 + 0.25 * 0.5)


def test_backoff_survives_huge_attempt_numbers():
    assert ExponentialBackoff(1.0, 2.0, 5.0, jitter=0.0).backoff(5000) == 5.0


@pytest.mark.parametrize("kwargs", [{"initial_delay": -1}, {"scale_factor": 0.5}, {"jitter": 1.5}])
def test_backoff_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        ExponentialBackoff(**kwargs)


# -- StandardRetryStrategy: attempts, delays, outcomes ----------------------------------------------------------


async def test_success_on_first_try_runs_once_and_never_waits(run):
    t = FakeTime()
    block = Block()
    assert await run(strategy(t), POLICY, block) == "done"
    assert (block.calls, t.sleeps) == (1, [])


async def test_retries_until_success_with_backoff_between_tries(run):
    t = FakeTime()
    block = Block(rpc(), rpc(Code.RESOURCE_EXHAUSTED), rpc(Code.ABORTED))
    assert await run(strategy(t, max_attempts=4), POLICY, block) == "done"
    assert block.calls == 4
    assert t.sleeps == [0.5, 1.0, 2.0]


async def test_too_many_attempts_carries_the_last_outcome(run):
    t = FakeTime()
    errors = [rpc(), rpc(), rpc()]
    block = Block(*errors, "never reached")
    with pytest.raises(TooManyAttemptsError) as caught:
        await run(strategy(t, max_attempts=3), POLICY, block)
    error = caught.value
    assert (error.attempts, block.calls) == (3, 3)
    assert error.outcome.exception is errors[2] and error.__cause__ is errors[2]
    assert t.sleeps == [0.5, 1.0]  # no wait after the last try
    assert "3 attempts" in str(error) and isinstance(error, RetryStrategyError)


async def test_one_attempt_means_no_retry(run):
    t = FakeTime()
    block = Block(rpc())
    with pytest.raises(TooManyAttemptsError) as caught:
        await run(strategy(t, max_attempts=1), POLICY, block)
    assert (caught.value.attempts, block.calls, t.sleeps) == (1, 1, [])


async def test_terminate_and_fail_raises_the_blocks_own_exception(run):
    t = FakeTime()
    error = rpc(Code.INVALID_ARGUMENT)
    block = Block(error)
    with pytest.raises(FakeRpcError) as caught:
        await run(strategy(t), POLICY, block)
    assert caught.value is error
    assert (block.calls, t.sleeps) == (1, [])


async def test_pushback_sets_the_delay_exactly_and_restarts_the_backoff(run):
    t = FakeTime()
    block = Block(rpc(), rpc(pushback="750"), rpc(), rpc())
    assert await run(strategy(t, max_attempts=5), POLICY, block) == "done"
    assert t.sleeps == [0.5, 0.75, 0.5, 1.0]


async def test_stop_pushback_fails_at_once(run):
    t = FakeTime()
    error = rpc(pushback="-1")
    block = Block(error)
    with pytest.raises(FakeRpcError) as caught:
        await run(strategy(t), POLICY, block)
    assert caught.value is error and block.calls == 1


async def test_pushback_does_not_exceed_max_attempts(run):
    t = FakeTime()
    block = Block(rpc(), rpc(pushback="10"))
    with pytest.raises(TooManyAttemptsError) as caught:
        await run(strategy(t, max_attempts=2), POLICY, block)
    assert (caught.value.attempts, t.sleeps) == (2, [0.5])


class Accepting(RetryPolicy):
    """NOT_FOUND means done (say, a delete); values the operation returns are rejected if they are "bad"."""

    def evaluate(self, outcome):
        if outcome.failed:
            return TerminateAndSucceed if outcome.exception.code() is Code.NOT_FOUND else RetryError(SERVER)
        return TerminateAndFail if outcome.value == "bad" else TerminateAndSucceed


async def test_a_failure_the_policy_accepts_returns_none(run):
    t = FakeTime()
    events: list = []
    bucket = RecordingBucket(StandardRetryTokenBucket(clock=t), events)
    assert await run(strategy(t, bucket=bucket), Accepting(), Block(rpc(Code.NOT_FOUND))) is None
    assert events == ["acquire", "success"]


async def test_a_rejected_value_raises_result_rejected(run):
    t = FakeTime()
    with pytest.raises(ResultRejectedError) as caught:
        await run(strategy(t), Accepting(), Block(rpc(), "bad"))
    assert (caught.value.attempts, caught.value.outcome.value, caught.value.__cause__) == (2, "bad", None)


async def test_a_policy_returning_nonsense_is_a_type_error_and_the_token_is_released(run):
    class Broken(RetryPolicy):
        def evaluate(self, outcome):
            return "retry please"

    t = FakeTime()
    events: list = []
    with pytest.raises(TypeError, match="Broken.evaluate"):
        await run(strategy(t, bucket=RecordingBucket(StandardRetryTokenBucket(clock=t), events)), Broken(), Block())
    assert events == ["acquire", "failure"]


# -- the token protocol, in the design's order ------------------------------------------------------------------


async def test_token_acquired_before_first_try_and_backoff_before_capacity(run):
    t = FakeTime()
    events: list = []
    bucket = RecordingBucket(StandardRetryTokenBucket(clock=t), events)
    s = StandardRetryStrategy(StandardRetryStrategyOptions(4), bucket, HALF, clock=t,
                              sleep=lambda d: events.append(f"sleep {d}"),
                              async_sleep=lambda d: asyncio.sleep(0, events.append(f"sleep {d}")))
    block = Block(rpc(), rpc(Code.RESOURCE_EXHAUSTED), during=lambda n: events.append(f"try {n}"))
    assert await run(s, POLICY, block) == "done"
    assert events == ["acquire", "try 1", "sleep 0.5", "retry SERVER_SIDE", "try 2", "sleep 1.0",
                      "retry THROTTLING", "try 3", "success"]


@pytest.mark.parametrize("steps, max_time, raised, events", [
    ([rpc(Code.INVALID_ARGUMENT)], None, FakeRpcError, ["acquire", "failure"]),
    ([rpc(), rpc()], None, TooManyAttemptsError, ["acquire", "retry SERVER_SIDE", "failure"]),
    ([rpc(), rpc()], 0.25, RetryTimeoutError, ["acquire", "failure"]),
    ([rpc(Code.RESOURCE_EXHAUSTED)], None, RetryCapacityExceededError, ["acquire", "retry THROTTLING", "failure"]),
])
async def test_every_failed_run_resolves_its_last_token_as_failure(run, steps, max_time, raised, events):
    t = FakeTime()
    log: list = []
    bucket = RecordingBucket(StandardRetryTokenBucket(clock=t, max_capacity=9), log)
    with pytest.raises(raised):
        await run(strategy(t, max_attempts=2, max_time=max_time, bucket=bucket), POLICY, Block(*steps))
    assert log == events


def test_an_interrupt_in_the_block_propagates_and_releases_the_token():
    t = FakeTime()
    events: list = []
    bucket = RecordingBucket(StandardRetryTokenBucket(clock=t), events)
    block = Block(rpc(), KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        strategy(t, bucket=bucket).retry(POLICY, block)
    assert block.calls == 2
    assert events == ["acquire", "retry SERVER_SIDE", "failure"]


async def test_cancelling_during_backoff_propagates_and_releases_the_token():
    t = FakeTime()
    events: list = []
    bucket = RecordingBucket(StandardRetryTokenBucket(clock=t), events)

    async def cancelled_sleep(delay):
        raise asyncio.CancelledError

    s = StandardRetryStrategy(StandardRetryStrategyOptions(3), bucket, HALF, clock=t, async_sleep=cancelled_sleep)
    block = Block(rpc())
    with pytest.raises(asyncio.CancelledError):
        await s.retry_async(POLICY, block.run_async)
    assert block.calls == 1
    assert events == ["acquire", "failure"]


def test_standard_tokens_resolve_once():
    bucket = StandardRetryTokenBucket(clock=FakeTime(), max_capacity=4)
    token = bucket.acquire_token()
    with pytest.raises(CapacityUnavailable):
        token.schedule_retry(SERVER)  # costs 5 > 4: the token stays unresolved...
    token.notify_failure()  # ...so it can still be resolved
    for resolve in (token.notify_failure, token.notify_success, lambda: token.schedule_retry(SERVER)):
        with pytest.raises(RuntimeError, match="already resolved"):
            resolve()


# -- StandardRetryTokenBucket -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code, cost", [(Code.UNAVAILABLE, 5), (Code.ABORTED, 5), (Code.RESOURCE_EXHAUSTED, 10),
                                        (Code.DEADLINE_EXCEEDED, 10)])
async def test_a_retry_costs_by_error_type_and_its_success_refunds_it(run, code, cost):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, refill_per_second=0)
    seen = []
    block = Block(rpc(code), during=lambda n: seen.append(bucket.capacity))
    assert await run(strategy(t, bucket=bucket), POLICY, block) == "done"
    assert seen == [500.0, 500.0 - cost]
    assert bucket.capacity == 500.0


def test_default_costs_price_throttling_and_timeouts_higher():
    assert dict(DEFAULT_RETRY_COSTS) == {SERVER: 5, CLIENT: 5, THROTTLING: 10, TIMEOUT: 10}
    assert StandardRetryTokenBucket(retry_costs={SERVER: 1}).retry_costs[SERVER] == 1


async def test_failures_keep_their_cost_and_first_try_successes_add_the_increment(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=20, refill_per_second=0)
    with pytest.raises(TooManyAttemptsError):
        await run(strategy(t, max_attempts=2, bucket=bucket), POLICY, Block(rpc(), rpc()))
    assert bucket.capacity == 15.0
    await run(strategy(t, bucket=bucket), POLICY, Block())
    assert bucket.capacity == 16.0
    await run(strategy(t, bucket=bucket), POLICY, Block(rpc(Code.DEADLINE_EXCEEDED)))
    assert bucket.capacity == 16.0  # 16 - 10 for the retry, + 10 when it succeeded


def test_bucket_refills_over_time_up_to_its_capacity():
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=20, refill_per_second=2)
    bucket.acquire_token().schedule_retry(THROTTLING).notify_failure()
    assert bucket.capacity == 10.0
    t.now += 1.5
    assert bucket.capacity == 13.0
    t.now += 100
    assert bucket.capacity == 20.0


async def test_backoff_time_refills_the_bucket(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=20, refill_per_second=2)
    seen = []
    block = Block(rpc(), rpc(), during=lambda n: seen.append(bucket.capacity))
    assert await run(strategy(t, bucket=bucket), POLICY, block) == "done"
    # try 2 after 0.5 s (full, so no refill): 20 - 5; try 3 after 1 s more: 15 + 2 - 5; success refunds 5.
    assert seen == [20.0, 15.0, 12.0]
    assert bucket.capacity == 17.0


async def test_empty_bucket_fails_a_retry_at_once(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=7, refill_per_second=0)
    errors = [rpc(), rpc(), rpc()]
    block = Block(*errors)
    with pytest.raises(RetryCapacityExceededError) as caught:
        await run(strategy(t, max_attempts=5, bucket=bucket), POLICY, block)
    assert (caught.value.attempts, block.calls) == (2, 2)
    assert caught.value.outcome.exception is errors[1] and caught.value.__cause__ is errors[1]
    assert t.sleeps == [0.5, 1.0]  # the backoff comes first, then the bucket is asked
    assert bucket.capacity == 2.0


async def test_blocking_bucket_waits_for_the_refill(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=7, refill_per_second=4, block=True)
    no_backoff = ExponentialBackoff(random=lambda: 0.0)
    block = Block(rpc(), rpc())
    assert await run(strategy(t, bucket=bucket, backoff=no_backoff), POLICY, block) == "done"
    assert t.sleeps == [0.75]  # 2 left, the retry needs 5: (5 - 2) / 4 per second
    assert bucket.capacity == 5.0  # 0 after the second retry, + 5 for its success


async def test_blocking_bucket_that_cannot_refill_fails_at_once(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=7, refill_per_second=0, block=True)
    with pytest.raises(RetryCapacityExceededError):
        await run(strategy(t, bucket=bucket, backoff=ExponentialBackoff(random=lambda: 0.0)), POLICY,
                  Block(rpc(), rpc()))
    assert t.sleeps == []


async def test_blocking_bucket_does_not_wait_past_the_time_limit(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=7, refill_per_second=1, block=True)
    with pytest.raises(RetryTimeoutError) as caught:
        await run(strategy(t, max_time=2.0, bucket=bucket, backoff=ExponentialBackoff(random=lambda: 0.0)), POLICY,
                  Block(rpc(), rpc()))
    assert (caught.value.attempts, t.sleeps) == (2, [])  # it would need 3 s


async def test_a_first_try_that_costs_can_be_refused(run):
    t = FakeTime()
    bucket = StandardRetryTokenBucket(clock=t, max_capacity=1, initial_try_cost=2)
    block = Block()
    with pytest.raises(RetryCapacityExceededError) as caught:
        await run(strategy(t, bucket=bucket), POLICY, block)
    assert (caught.value.attempts, caught.value.outcome, block.calls) == (0, None, 0)


# -- the total time limit ---------------------------------------------------------------------------------------


async def test_time_limit_stops_retrying_when_the_tries_take_too_long(run):
    t = FakeTime()
    steady = ExponentialBackoff(1.0, 1.0, 1.0, jitter=0.0)
    errors = [rpc(), rpc(), rpc()]
    block = Block(*errors, clock=t, duration=3.0)
    with pytest.raises(RetryTimeoutError) as caught:
        await run(strategy(t, max_attempts=10, max_time=10.0, backoff=steady), POLICY, block)
    # tries end at 3, 7 and 11 s; the third has no time left for a retry
    assert (caught.value.attempts, block.calls, t.sleeps) == (3, 3, [1.0, 1.0])
    assert caught.value.outcome.exception is errors[2]


async def test_time_limit_refuses_a_backoff_that_would_cross_it(run):
    t = FakeTime()
    doubling = ExponentialBackoff(1.0, 2.0, 100.0, jitter=0.0)
    with pytest.raises(RetryTimeoutError) as caught:
        await run(strategy(t, max_attempts=10, max_time=10.0, backoff=doubling), POLICY, Block(*[rpc()] * 9))
    assert (caught.value.attempts, t.sleeps, t.now) == (4, [1.0, 2.0, 4.0], 7.0)  # 7 + 8 > 10: no sleep


async def test_a_late_success_is_still_returned(run):
    t = FakeTime()
    assert await run(strategy(t, max_time=1.0), POLICY, Block(clock=t, duration=5.0)) == "done"


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"max_attempts": 2.5}, {"max_time": 0}, {"max_time": -1}])
def test_options_are_validated(kwargs):
    with pytest.raises(ValueError):
        StandardRetryStrategyOptions(**kwargs)


# -- decorator, defaults, logging -------------------------------------------------------------------------------


def test_decorator_retries_a_sync_function_with_its_arguments():
    t = FakeTime()
    calls = []

    @strategy(t).retrying()
    def fetch(key, *, shard):
        """Docstring kept."""
        calls.append((key, shard))
        if len(calls) < 3:
            raise rpc()
        return f"{key}@{shard}"

    assert fetch("k", shard=2) == "k@2"
    assert calls == [("k", 2)] * 3 and t.sleeps == [0.5, 1.0]
    assert fetch.__name__ == "fetch" and fetch.__doc__ == "Docstring kept."


async def test_decorator_retries_an_async_function():
    t = FakeTime()
    calls = []

    @strategy(t).retrying(StandardRetryPolicy({Code.UNAVAILABLE: SERVER}))
    async def fetch(key):
        calls.append(key)
        await asyncio.sleep(0)
        if len(calls) < 2:
            raise rpc()
        return key * 2

    assert inspect.iscoroutinefunction(fetch)
    assert await fetch("ab") == "abab"
    assert calls == ["ab", "ab"] and t.sleeps == [0.5]


def test_decorator_refuses_a_function_in_place_of_a_policy():
    with pytest.raises(TypeError, match="retrying()"):
        strategy(FakeTime()).retrying(lambda: None)


def test_defaults_build_a_working_strategy():
    slept = []
    s = StandardRetryStrategy(sleep=slept.append)
    assert s.options == StandardRetryStrategyOptions(3, None)
    assert s.retry(POLICY, Block(rpc())) == "done"
    assert len(slept) == 1 and 0 <= slept[0] <= 0.1


def test_debug_log_tells_each_try_and_decision(caplog):
    caplog.set_level(logging.DEBUG, logger="grpc_retry")
    strategy(FakeTime()).retry(POLICY, Block(rpc()))
    messages = [r.getMessage() for r in caplog.records if r.name == "grpc_retry.strategy"]
    assert messages[0] == "try 1 failed: StatusCode.UNAVAILABLE: RetryError(reason=<RetryErrorType.SERVER_SIDE: " \
                          "'server_side'>, delay=None)"
    assert messages[1] == "retry 2 in 0.500s (SERVER_SIDE)"
    assert messages[2] == "try 2 returned: TerminateAndSucceed"


# -- the whole rule, for any sequence -----------------------------------------------------------------------------


@given(failures=st.integers(0, 8), max_attempts=st.integers(1, 6))
def test_tries_and_delays_for_any_failure_count(failures, max_attempts):
    t = FakeTime()
    block = Block(*[rpc() for _ in range(failures)])
    s = strategy(t, max_attempts=max_attempts)
    if failures < max_attempts:
        assert s.retry(POLICY, block) == "done"
    else:
        with pytest.raises(TooManyAttemptsError) as caught:
            s.retry(POLICY, block)
        assert caught.value.attempts == max_attempts
    tries = min(failures + 1, max_attempts)
    assert block.calls == tries
    assert t.sleeps == [HALF.backoff(n) for n in range(1, tries)]
    assert s.token_bucket.capacity == 500.0 - 5 * (tries - 1) + (5 if failures < max_attempts and tries > 1 else 0)
