"""grpc_retry.strategy over plain grpcio channels with `grpc.enable_retries=0`, against a real server on loopback.

The server fails a scripted sequence; the strategy retries a whole two-call operation. The server must see one
attempt per call per try, in order, and the strategy must ask for exactly the delays its backoff and the server's
pushback dictate. Sleeps are recorded, not slept. Each test runs over the sync API and over grpc.aio.
"""

from __future__ import annotations

import json

import grpc
import grpc.aio
import pytest
from support.backend import SERVER_STREAM, UNARY, Step, fail, pushback

from grpc_retry.strategy import (
    ExponentialBackoff,
    RetryStrategy,
    StandardRetryPolicy,
    StandardRetryStrategy,
    StandardRetryStrategyOptions,
    StandardRetryTokenBucket,
    TooManyAttemptsError,
)

Code = grpc.StatusCode
NO_RETRIES = [("grpc.enable_retries", 0)]
POLICY = StandardRetryPolicy()
# A service config that would have C-core retry UNAVAILABLE itself, were retries not disabled on the channel.
CORE_RETRIES = ("grpc.service_config", json.dumps({"methodConfig": [{
    "name": [{"service": "grpc_retry.test.Echo"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]}))


class Recorder:
    """A strategy with a frozen clock (so the bucket arithmetic is exact) whose sleeps are recorded only."""

    def __init__(self, max_attempts: int):
        self.sleeps: list = []
        self.bucket = StandardRetryTokenBucket(clock=lambda: 0.0)
        self.strategy: RetryStrategy = StandardRetryStrategy(
            StandardRetryStrategyOptions(max_attempts), self.bucket,
            ExponentialBackoff(0.1, 2.0, 1.0, random=lambda: 0.5),  # 0.05, 0.1, 0.2, ...
            clock=lambda: 0.0, sleep=self.sleeps.append, async_sleep=self._async_sleep)

    async def _async_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def read_then_write(channel: grpc.Channel) -> list:
    """The operation: a unary read, then a server-streaming write that depends on it (bytes, no serializers)."""
    read = channel.unary_unary(UNARY)(b"read", timeout=10)
    return list(channel.unary_stream(SERVER_STREAM)(read + b"+write", timeout=10))


async def read_then_write_async(channel: grpc.aio.Channel) -> list:
    read = await channel.unary_unary(UNARY)(b"read", timeout=10)
    return [part async for part in channel.unary_stream(SERVER_STREAM)(read + b"+write", timeout=10)]


@pytest.fixture(params=["sync", "async"])
def perform(request, backend):
    """perform(recorder, options): run read_then_write once under the recorder's strategy, sync or aio."""

    async def perform(recorder: Recorder, options=NO_RETRIES):
        if request.param == "sync":
            with grpc.insecure_channel(backend.target, options=options) as channel:
                return recorder.strategy.retry(POLICY, lambda: read_then_write(channel))
        async with grpc.aio.insecure_channel(backend.target, options=options) as channel:
            return await recorder.strategy.retry_async(POLICY, lambda: read_then_write_async(channel))

    return perform


def methods(backend) -> list:
    return [attempt.method for attempt in backend.attempts]


async def test_the_whole_operation_is_retried_one_attempt_per_try(backend, perform):
    backend.script(UNARY, Step(), Step(), fail(Code.RESOURCE_EXHAUSTED))
    backend.script(SERVER_STREAM, fail(Code.UNAVAILABLE), pushback(300))
    recorder = Recorder(max_attempts=4)

    assert await perform(recorder) == [b"read+write#0", b"read+write#1", b"read+write#2"]

    # try 1: write UNAVAILABLE; try 2: write pushed back; try 3: read throttled; try 4: both succeed
    assert methods(backend) == [UNARY, SERVER_STREAM, UNARY, SERVER_STREAM, UNARY, UNARY, SERVER_STREAM]
    assert [a.requests for a in backend.attempts_of(SERVER_STREAM)] == [[b"read+write"]] * 3
    assert all(a.previous is None for a in backend.attempts)  # no C-core retry underneath
    # backoff 1, then exactly the pushback, then backoff 1 again (a pushback restarts the sequence)
    assert recorder.sleeps == [0.05, 0.3, 0.05]
    # retries cost 5 (UNAVAILABLE), 5 (UNAVAILABLE), 10 (RESOURCE_EXHAUSTED); the last one's success refunds 10
    assert recorder.bucket.capacity == 490.0


async def test_gives_up_after_max_attempts_with_the_last_rpc_error(backend, perform):
    backend.script(UNARY, fail(Code.UNAVAILABLE, "down 1"), fail(Code.UNAVAILABLE, "down 2"),
                   fail(Code.DEADLINE_EXCEEDED, "slow 3"))
    recorder = Recorder(max_attempts=3)

    with pytest.raises(TooManyAttemptsError) as caught:
        await perform(recorder)

    last = caught.value.outcome.exception
    assert caught.value.attempts == 3 and caught.value.__cause__ is last
    assert isinstance(last, grpc.RpcError) and (last.code(), last.details()) == (Code.DEADLINE_EXCEEDED, "slow 3")
    assert methods(backend) == [UNARY] * 3
    assert recorder.sleeps == [0.05, 0.1]
    assert recorder.bucket.capacity == 490.0  # two UNAVAILABLE retries at 5; failures refund nothing


@pytest.mark.parametrize("step", [fail(Code.INVALID_ARGUMENT, "bad request"),
                                  fail(Code.UNAVAILABLE, "bad request", trailing=(("grpc-retry-pushback-ms", "-1"),))],
                         ids=["client-side code", "stop pushback"])
async def test_non_retryable_failure_is_raised_as_is_after_one_attempt(backend, perform, step):
    backend.script(UNARY, step)
    recorder = Recorder(max_attempts=4)

    with pytest.raises(grpc.RpcError) as caught:
        await perform(recorder)

    assert (caught.value.code(), caught.value.details()) == (step.code, "bad request")
    assert methods(backend) == [UNARY]
    assert recorder.sleeps == []
    assert recorder.bucket.capacity == 500.0


async def test_enable_retries_0_leaves_retrying_to_the_strategy_alone(backend, perform):
    # Control: with C-core's retries on, one try of the strategy hides a retry the strategy never sees.
    backend.script(UNARY, fail(Code.UNAVAILABLE))
    assert await perform(Recorder(max_attempts=1), options=[CORE_RETRIES]) == [b"read+write#0", b"read+write#1",
                                                                                 b"read+write#2"]
    assert [a.previous for a in backend.attempts_of(UNARY)] == [None, "1"]

    # The same failure through a channel with the same service config but retries disabled: one attempt, the
    # strategy (allowed a single try here) sees the failure.
    backend.script(UNARY, fail(Code.UNAVAILABLE))
    with pytest.raises(TooManyAttemptsError):
        await perform(Recorder(max_attempts=1), options=[CORE_RETRIES, *NO_RETRIES])
    assert len(backend.attempts_of(UNARY)) == 3
