"""The defects the chaos soak found, each against real servers, each bounded so that a regression fails the test
instead of hanging the suite:

- sync: a failed stream-unary attempt whose status came before its headers froze its backend's grpcio channel
  (a done callback on grpcio's own thread asked it for initial_metadata());
- sync: cancel() while another thread waits in code() / result() of a response stream left that thread stuck;
- asyncio: cancelling the task that awaits a call with a done callback let the call run on to OK;
- asyncio: stream-unary calls ended a second and more past short deadlines on a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Callable

import grpc
import pytest
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, Step, fail
from support.h2_fault import NO_STREAMS, H2FaultServer

import grpc_retry
import grpc_retry.aio

SERVICE = "grpc_retry.test.Echo"
RETRY = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]})
HEDGING = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "hedgingPolicy": {
    "maxAttempts": 2, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]})
POLICIES = {"none": None, "retry": RETRY, "hedging": HEDGING}


def within(seconds: float, fn: Callable[[], Any], what: str) -> Any:
    """fn() on another thread; fails (never hangs) if it has not returned within `seconds`."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as error:  # noqa: B036 - handed back to the test
            box["error"] = error

    thread = threading.Thread(target=run, name="within", daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{what} still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def sync_channel(backend: Backend, policy: str) -> grpc.Channel:
    config = POLICIES[policy]
    return grpc_retry.insecure_channel(backend.target, options=[] if config is None else
                                       [("grpc.service_config", config)])


def code_of(fn: Callable[[], Any]) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


# -- sync stream-unary: an attempt whose status came before its headers ------------------------------------------


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
@pytest.mark.parametrize("fault", ["deadline", "trailers_only"])
def test_sync_stream_unary_status_before_headers_leaves_the_backend_usable(backend, policy, fault):
    attempts = {"none": 1, "retry": 3, "hedging": 2}[policy]
    if fault == "deadline":  # every attempt held until the client gives up
        backend.script(CLIENT_STREAM, *[Step(wait=0)] * (1 if policy == "retry" else attempts))
        expected, timeout = grpc.StatusCode.DEADLINE_EXCEEDED, 0.2
    else:  # Trailers-Only UNAVAILABLE on every attempt
        backend.script(CLIENT_STREAM, *[fail()] * attempts)
        expected, timeout = grpc.StatusCode.UNAVAILABLE, 5
    channel = sync_channel(backend, policy)
    method = channel.stream_unary(CLIENT_STREAM)
    future = method.future(iter([b"a", b"b"]), timeout=timeout)
    # The future ends on time ...
    assert within(5, lambda: code_of(lambda: future.result(timeout=4)), "future.result()") == expected
    assert within(2, future.code, "future.code()") == expected
    # ... and the backend's channel still carries calls: the next one succeeds.
    assert within(5, lambda: method(iter([b"c"]), timeout=4), "the next call") == b"c"
    within(2, future.cancel, "cancel()")
    within(2, channel.close, "channel.close()")


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
@pytest.mark.parametrize("fault", ["deadline", "trailers_only"])
async def test_aio_stream_unary_status_before_headers_leaves_the_backend_usable(backend, policy, fault):
    attempts = {"none": 1, "retry": 3, "hedging": 2}[policy]
    if fault == "deadline":
        backend.script(CLIENT_STREAM, *[Step(wait=0)] * (1 if policy == "retry" else attempts))
        expected, timeout = grpc.StatusCode.DEADLINE_EXCEEDED, 0.2
    else:
        backend.script(CLIENT_STREAM, *[fail()] * attempts)
        expected, timeout = grpc.StatusCode.UNAVAILABLE, 5
    config = POLICIES[policy]
    async with grpc_retry.aio.insecure_channel(backend.target, options=[] if config is None else
                                               [("grpc.service_config", config)]) as channel:
        method = channel.stream_unary(CLIENT_STREAM)
        call = method(iter([b"a", b"b"]), timeout=timeout)
        assert await asyncio.wait_for(call.code(), 5) == expected
        assert await asyncio.wait_for(method(iter([b"c"]), timeout=4), 5) == b"c"


# -- sync response streams: cancel() while another thread waits for the status --------------------------------------


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
@pytest.mark.parametrize("wait_in", ["code", "details", "result", "exception"])
@pytest.mark.parametrize("read", [0, 1])
def test_sync_cancel_wakes_a_thread_waiting_for_a_response_streams_status(backend, policy, wait_in, read):
    # The attempt runs until cancelled: before any response, or after the first (which the application reads).
    backend.script(SERVER_STREAM, *[Step(wait=0) if read == 0 else Step(hold_after=1)] * 2)
    channel = sync_channel(backend, policy)
    call = channel.unary_stream(SERVER_STREAM)(b"x", timeout=30)
    backend.wait_attempts(SERVER_STREAM, 1, timeout=5)
    for _ in range(read):
        assert within(5, lambda: next(call), "next(call)") == b"x#0"
    waiting = threading.Event()
    seen: dict = {}

    def waiter():
        waiting.set()
        try:
            seen["value"] = getattr(call, wait_in)()
        except BaseException as error:  # noqa: B036
            seen["value"] = type(error)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    waiting.wait(5)
    time.sleep(0.05)  # no event says "blocked inside code()"; cancelling earlier tests the same end, less well
    assert call.cancel()
    thread.join(2)
    assert not thread.is_alive(), f"{wait_in}() still blocked 2 s after cancel()"
    expected = {"code": grpc.StatusCode.CANCELLED, "details": "Locally cancelled by application!",
                "result": grpc.FutureCancelledError, "exception": grpc.FutureCancelledError}[wait_in]
    assert seen["value"] == expected
    # Every attempt the server saw end was cancelled (with hedging a second may start about when cancel() comes).
    ended = [a for a in backend.wait_all_ended(SERVER_STREAM, timeout=5) if a.ended is not None]
    assert ended and all(attempt.cancelled for attempt in ended), ended
    within(2, channel.close, "channel.close()")


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
@pytest.mark.parametrize("wait_in", ["code", "details", "trailing_metadata"])
@pytest.mark.parametrize("read", [0, 1])
async def test_aio_cancel_wakes_a_task_waiting_for_a_response_streams_status(backend, policy, wait_in, read):
    backend.script(SERVER_STREAM, *[Step(wait=0) if read == 0 else Step(hold_after=1)] * 2)
    config = POLICIES[policy]
    async with grpc_retry.aio.insecure_channel(backend.target, options=[] if config is None else
                                               [("grpc.service_config", config)]) as channel:
        call = channel.unary_stream(SERVER_STREAM)(b"x", timeout=30)
        for _ in range(read):
            assert await asyncio.wait_for(call.read(), 5) == b"x#0"
        # The attempt is at the server (under load it may still be on its way after the 50 ms below).
        await asyncio.get_running_loop().run_in_executor(None, backend.wait_attempts, SERVER_STREAM, 1, 5)
        waiter = asyncio.ensure_future(getattr(call, wait_in)())
        await asyncio.sleep(0.05)  # the waiter is parked in the wait (nothing signals that it is)
        assert not waiter.done()
        assert call.cancel()
        await asyncio.wait_for(waiter, 2)
        assert await call.code() == grpc.StatusCode.CANCELLED and call.cancelled()
    ended = [a for a in backend.wait_all_ended(SERVER_STREAM, timeout=5) if a.ended is not None]
    assert ended and all(attempt.cancelled for attempt in ended), ended


# -- asyncio: cancelling the task that awaits a call with a done callback ------------------------------------------


async def _timed_out_call(make_channel, backend: Backend, policy: str):
    backend.script(UNARY, *[Step(wait=1.0)] * 3)  # each attempt would answer OK after 1 s
    config = POLICIES[policy]
    async with make_channel(backend.target, options=[] if config is None else
                            [("grpc.service_config", config)]) as channel:
        call = channel.unary_unary(UNARY)(b"x", timeout=10)
        reported = asyncio.get_running_loop().create_future()
        call.add_done_callback(lambda c: reported.done() or reported.set_result(c))
        await asyncio.sleep(0.01)  # the loop runs before anyone awaits the call
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(call, 0.2)
        done = await asyncio.wait_for(reported, 2)
        elapsed = time.monotonic() - started
        return call.cancelled(), await call.code(), await done.code(), elapsed


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
async def test_aio_cancelling_the_awaiting_task_cancels_a_call_with_a_done_callback(backend, policy):
    cancelled, code, reported, elapsed = await _timed_out_call(grpc_retry.aio.insecure_channel, backend, policy)
    attempts = backend.wait_all_ended(UNARY, timeout=5)
    expected = await _timed_out_call(grpc.aio.insecure_channel, Backend(), "none")  # grpc.aio, side by side
    assert (cancelled, code, reported) == expected[:3] == (True, grpc.StatusCode.CANCELLED,
                                                           grpc.StatusCode.CANCELLED)
    assert elapsed < 0.9, "the call ran on after its task was cancelled"
    assert all(a.cancelled for a in attempts), "an attempt ran on at the server after its call was cancelled"


# -- hedged stream-unary calls whose servers answer late, with no headers ahead --------------------------------------


async def test_aio_hedged_stream_unary_answered_late_completes(backend):
    backend.script(CLIENT_STREAM, *[Step(wait=0.1)] * 2)  # each hedge answers after 0.1 s, headers and all at once
    async with grpc_retry.aio.insecure_channel(backend.target, options=[("grpc.service_config", HEDGING)]) as ch:
        call = ch.stream_unary(CLIENT_STREAM)(iter([b"a", b"b"]), timeout=10)
        assert await asyncio.wait_for(call, 5) == b"a|b"
    assert len(backend.attempts_of(CLIENT_STREAM)) == 2


def test_sync_hedged_stream_unary_answered_late_completes(backend):
    backend.script(CLIENT_STREAM, *[Step(wait=0.1)] * 2)
    with sync_channel(backend, "hedging") as channel:
        assert within(5, lambda: channel.stream_unary(CLIENT_STREAM)(iter([b"a", b"b"]), timeout=10),
                      "the call") == b"a|b"
    assert len(backend.attempts_of(CLIENT_STREAM)) == 2


async def _turns_past_deadline(make_channel: Callable[[str], Any]) -> int:
    """Loop turns from a stream-unary call's deadline to its awaiting task's DEADLINE_EXCEEDED, with the attempt's
    metadata held unsent (the peer allows no stream) and every loop turn taking 30 ms."""
    peer = H2FaultServer(NO_STREAMS)
    channel = make_channel(peer.target)
    turns, deadline_turn, lagging = 0, -1, True
    deadline = float("inf")

    def slow_turn() -> None:
        nonlocal turns, deadline_turn
        if lagging:
            turns += 1
            if deadline_turn < 0 and time.monotonic() >= deadline:
                deadline_turn = turns
            time.sleep(0.03)
            asyncio.get_running_loop().call_soon(slow_turn)

    try:
        await channel.channel_ready()
        call = channel.stream_unary(CLIENT_STREAM)(iter([b"a", b"b"]), timeout=0.3)
        deadline = time.monotonic() + 0.3
        asyncio.get_running_loop().call_soon(slow_turn)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(call, 10)
        turns_late = turns - deadline_turn
        lagging = False
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert raised.value.details() == "Deadline Exceeded"
        return turns_late
    finally:
        lagging = False
        await channel.close()
        peer.stop()


@pytest.mark.parametrize("policy", ["none", "retry"])
async def test_asyncio_a_stream_unary_call_ends_at_its_deadline_on_a_lagging_loop(policy):
    """The soak's late calls: grpc_retry.aio stream-unary calls ending a second and more after their deadline, on a
    loop lagging tens of ms a turn (hundreds at the top) with two shared cores under four clients. Their attempts
    were grpc.aio's stream-unary calls, which ask for their status only once the response headers came: the
    deadline reached the call through C-core's threads, grpcio's poller thread and three batches one after
    another, each a wait for a thread or the loop. An attempt now has its status batch in flight from its start.
    Here grpc.aio's own call takes 7 turns; grpc_retry's 4 (rarely 5, the poller thread's hand-off a turn late):
    the turn the poller hands C-core's completion to, the one its done callback ends the call in, the awaiting
    task's, and asyncio.wait_for's. With another test suite on the same two cores, C-core's threads can be late
    too (11 turns, once): the best of three calls is taken, each on a new channel. A late path of its own makes
    grpc_retry's call late every time."""
    config = POLICIES[policy]
    options = [] if config is None else [("grpc.service_config", config)]
    grpcio_turns = await _turns_past_deadline(lambda target: grpc.aio.insecure_channel(target, options=options))
    tries = []
    while len(tries) < 3 and (not tries or tries[-1] > 5):
        tries.append(await _turns_past_deadline(
            lambda target: grpc_retry.aio.insecure_channel(target, options=options)))
    turns = min(tries)
    assert 0 <= turns <= 5, tries
    assert turns < grpcio_turns, (tries, grpcio_turns)


# -- sync hedged response streams: a first message read before the attempt won, and the status right behind it --


def test_sync_hedged_stream_keeps_a_first_message_read_before_its_status(backend):
    # A bidi call that ends as soon as it has echoed its one request: the hedge watcher reads the first message
    # (which commits), and the attempt's status often comes before the application reads. 1 in 4 of these calls
    # returned no message before (the attempt was gone when the reader looked, and the message with it).
    backend.fallback(BIDI, lambda i: Step())
    channel = sync_channel(backend, "hedging")
    bidi = channel.stream_stream(BIDI)
    lost = [i for i in range(100) if list(bidi(iter([b"r"]), timeout=10)) != [b"r"]]
    within(2, channel.close, "channel.close()")
    assert lost == []
