"""asyncio: cancelling the task that waits on a call with one request (unary-stream, unary-unary) cancels the call,
as on grpc.aio, wherever that task waits.

grpc.aio's `wait_for_connection()` of such a call awaits the task that sends its request (and, for a unary-stream
call, receives its headers); cancelling the waiting task cancels that one, whose handler cancels the RPC. Reads of a
response stream cancel the call too (grpc_retry: `_read_message`), before the first message, in a retry's backoff
and between messages; the chaos soak cancels its tasks there.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import grpc
import pytest
from support.backend import SERVER_STREAM, UNARY, Backend, Step, pushback

import grpc_retry.aio

SERVICE = "grpc_retry.test.Echo"
RETRY = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]})
HEDGING = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "hedgingPolicy": {
    "maxAttempts": 2, "hedgingDelay": "10s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]})
POLICIES = {"none": None, "retry": RETRY, "hedging": HEDGING}


def _options(policy: str) -> list:
    config = POLICIES[policy]
    return [] if config is None else [("grpc.service_config", config)]


async def _cancel_waiting_task(make_channel: Callable[..., Any], backend: Backend, kind: str, policy: str,
                               wait: Callable[[Any], Any]) -> tuple:
    """Make a call whose attempt the server holds (no headers), have a task wait on it with `wait`, cancel that
    task once it is parked: (the task ended cancelled, the call ended, its code)."""
    path = SERVER_STREAM if kind == "unary_stream" else UNARY
    backend.script(path, *[Step(wait=30)] * 3)  # held until the client gives up
    async with make_channel(backend.target, options=_options(policy)) as channel:
        call = getattr(channel, kind)(path)(b"x", timeout=30)
        await asyncio.get_running_loop().run_in_executor(None, backend.wait_attempts, path, 1, 5)
        task = asyncio.ensure_future(wait(call))
        await asyncio.sleep(0.05)  # parked in its wait
        assert not task.done() and not call.done()
        task.cancel()
        await asyncio.wait((task,), timeout=5)
        assert task.done(), "the task did not end on its cancellation"
        ended = call.done()
        if not ended:
            call.cancel()  # (so that the channel closes at once)
        return task.cancelled() or isinstance(task.exception(), asyncio.CancelledError), ended, await call.code()


async def _wait_for_connection(call: Any) -> None:
    await call.wait_for_connection()


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
@pytest.mark.parametrize("kind", ["unary_stream", "unary_unary"])
async def test_aio_cancelling_a_task_in_wait_for_connection_cancels_the_call(backend, kind, policy):
    reference = Backend()
    try:  # grpc.aio, side by side: its wait is on the task sending the request, whose cancellation cancels the RPC
        expected = await _cancel_waiting_task(grpc.aio.insecure_channel, reference, kind, "none", _wait_for_connection)
    finally:
        reference.stop()
    assert expected == (True, True, grpc.StatusCode.CANCELLED)
    outcome = await _cancel_waiting_task(grpc_retry.aio.insecure_channel, backend, kind, policy, _wait_for_connection)
    assert outcome == expected, "the call ran on after the task waiting in wait_for_connection() was cancelled"
    attempts = backend.wait_all_ended(UNARY if kind == "unary_unary" else SERVER_STREAM, timeout=5)
    assert all(attempt.cancelled for attempt in attempts), attempts


# -- reads of a response stream: where the soak's tasks are cancelled ---------------------------------------------


async def _iterate(call: Any) -> None:
    async for _ in call:
        pass


async def _read(call: Any) -> None:
    while await call.read() is not grpc.aio.EOF:
        pass


@pytest.mark.parametrize("consume", [_iterate, _read], ids=["iterate", "read"])
@pytest.mark.parametrize("phase", ["first_message", "backoff", "next_message"])
async def test_aio_cancelling_a_task_reading_a_response_stream_cancels_the_call(backend, consume, phase):
    if phase == "first_message":
        steps = [Step(wait=30)]  # held before its headers
    elif phase == "backoff":
        steps = [pushback(10_000), Step(wait=30)]  # the reader waits for the retry, 10 s away
    else:
        steps = [Step(responses=3, hold_after=1)]  # one message, then held
    backend.script(SERVER_STREAM, *steps)
    async with grpc_retry.aio.insecure_channel(backend.target, options=_options("retry")) as channel:
        call = channel.unary_stream(SERVER_STREAM)(b"x", timeout=30)
        await asyncio.get_running_loop().run_in_executor(None, backend.wait_attempts, SERVER_STREAM, 1, 5)
        task = asyncio.ensure_future(consume(call))
        await asyncio.sleep(0.1)
        assert not task.done() and not call.done()
        task.cancel()
        await asyncio.wait((task,), timeout=5)
        assert task.cancelled() and call.done(), "the call ran on after the task reading it was cancelled"
        assert await call.code() == grpc.StatusCode.CANCELLED
