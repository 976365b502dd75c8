"""close() on either channel ends every call, timer, thread and task the channel started, promptly, the way
grpcio's close ends its calls (checked side by side); and channels that come and go leave nothing behind."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from typing import Any, Callable, List

import grpc
import pytest
from support import GRPCIO
from support.backend import CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, Step, fail

import grpc_retry
import grpc_retry.aio
from grpc_retry._timer import TIMERS

SERVICE = "grpc_retry.test.Echo"
RETRY = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "5s", "maxBackoff": "5s", "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]})
HEDGING = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "hedgingPolicy": {
    "maxAttempts": 3, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]})
CONFIGS = {"none": None, "retry": RETRY, "hedging": HEDGING, "quick retry": RETRY.replace('"5s"', '"0.01s"')}


def options(policy: str) -> list:
    config = CONFIGS[policy]
    return [] if config is None else [("grpc.service_config", config)]


def ours_threads() -> set:
    """Threads of the client side (the in-process test servers' pools excluded; and grpc.aio's process-wide
    poller, which lives as long as any grpc.aio channel object does, closed or not, until the GC takes it:
    the aio test checks that none is left instead)."""
    return {t for t in threading.enumerate() if t.is_alive() and not t.name.startswith("ThreadPoolExecutor") and
            "_poll_wrapper" not in t.name}


def settle(condition: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # threads end on their own; nothing signals it
    return True


def status_of(fn: Callable[[], Any]):
    try:
        fn()
    except grpc.RpcError as error:
        return error.code(), error.details()
    except grpc.FutureCancelledError:
        return "FutureCancelledError"
    return grpc.StatusCode.OK, None


# -- sync --------------------------------------------------------------------------------------------------------


def _sync_scenario(make_channel, backend: Backend, policy: str):
    """Calls in every condition a call can be in when its channel closes; what each ended with, and how long
    close() took."""
    backend.script(UNARY, Step(wait=0), Step(wait=0), Step(wait=0), Step(wait=0))
    backend.script(SERVER_STREAM, Step(hold_after=1))
    channel = make_channel(backend.target, options=options(policy))
    unary = channel.unary_unary(UNARY)
    future = unary.future(b"held", timeout=30)
    stream = channel.unary_stream(SERVER_STREAM)(b"s", timeout=3)  # grpc.aio < 1.83 leaves it to its deadline
    assert next(stream) == b"s#0"
    blocking: List[Any] = []
    thread = threading.Thread(target=lambda: blocking.append(status_of(lambda: unary(b"blocking", timeout=30))))
    thread.start()
    backend.wait_attempts(UNARY, 2, timeout=5)
    started = time.monotonic()
    channel.close()
    took = time.monotonic() - started
    thread.join(2)
    outcomes = {
        "future": status_of(lambda: future.result(timeout=2)),
        "stream": status_of(lambda: list(stream)),
        "blocking": blocking[0] if blocking else "still blocked",
        "after close": _raises(lambda: unary(b"late", timeout=1)),
    }
    return outcomes, took


def _raises(fn: Callable[[], Any]):
    try:
        fn()
    except Exception as error:
        return type(error).__name__, str(error)
    return None


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
def test_sync_close_ends_every_call_at_once_as_grpcio_does(policy):
    theirs_backend, ours_backend = Backend(), Backend()
    try:
        expected, _ = _sync_scenario(grpc.insecure_channel, theirs_backend, "none")
        outcomes, took = _sync_scenario(grpc_retry.insecure_channel, ours_backend, policy)
        assert outcomes == expected
        assert took < 0.1, f"close() took {took * 1000:.0f} ms"
        for attempt in ours_backend.wait_all_ended(UNARY, timeout=5):
            assert attempt.cancelled, "an attempt ran on at the server after its channel closed"
    finally:
        theirs_backend.stop()
        ours_backend.stop()


def test_sync_close_ends_calls_in_backoff_and_their_timer(backend):
    # Every attempt fails. A retry's delay is random(0, 5 s): now and then one comes within the 10 ms between two
    # looks at the state, so the call goes to BACKOFF again rather than succeeding (all three that quick: ~1e-5).
    backend.fallback(UNARY, lambda i: fail())
    channel = grpc_retry.insecure_channel(backend.target, options=options("retry"))
    future = channel.unary_unary(UNARY).future(b"x", timeout=30)
    try:
        assert settle(lambda: future._machine.state_name == "BACKOFF" and TIMERS.pending() >= 1)
    finally:
        channel.close()  # a failure here must not leave the channel's threads to the next test
    assert future.exception(timeout=1).code() == grpc.StatusCode.CANCELLED
    assert future.exception().details() == "Channel closed!"
    assert settle(lambda: TIMERS.pending() == 0)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "quick retry", "hedging"])
def test_sync_channels_that_come_and_go_leave_no_thread(backend, policy):
    backend.fallback(UNARY, lambda i: fail() if i % 3 == 0 else Step())
    with grpc_retry.insecure_channel(backend.target, options=options(policy)) as warm:  # grpcio's own threads
        warm.unary_unary(UNARY).future(b"w").exception(timeout=5)
    assert settle(lambda: not [t for t in ours_threads() if t.name.startswith("grpc_retry")])
    before = ours_threads()
    for i in range(400):  # (a thread left per channel, or per call, shows within a few)
        channel = grpc_retry.insecure_channel(backend.target, options=options(policy))
        future = channel.unary_unary(UNARY).future(b"x", timeout=5)
        if i % 2:
            future.exception(timeout=5)
        channel.close()
        assert future.done()
    assert settle(lambda: ours_threads() <= before), sorted(t.name for t in ours_threads() - before)


# -- asyncio -----------------------------------------------------------------------------------------------------


async def no_tasks_left(timeout: float = 1.0) -> bool:
    """Whether every task but this one has ended. grpc.aio's own tasks for the calls a close cancelled end a
    moment after the close (its own close leaves 3 or 4 such for ~10 ms), so they get a moment."""
    deadline = time.monotonic() + timeout
    while asyncio.all_tasks() != {asyncio.current_task()}:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def _aio_scenario(make_channel, backend: Backend, policy: str, grace):
    """A call that ends within the grace period, one held past it, a stream held after its first message."""
    backend.script(CLIENT_STREAM, *[Step(wait=0.1)] * 3)
    backend.script(UNARY, *[Step(wait=0)] * 3)
    backend.script(SERVER_STREAM, Step(hold_after=1))
    channel = make_channel(backend.target, options=options(policy))
    unary = channel.unary_unary(UNARY)
    quick = channel.stream_unary(CLIENT_STREAM)(iter([b"quick"]), timeout=30)
    held = unary(b"held", timeout=30)
    stream = channel.unary_stream(SERVER_STREAM)(b"s", timeout=3)  # grpc.aio < 1.83 leaves it to its deadline
    assert await stream.read() == b"s#0"
    await asyncio.get_running_loop().run_in_executor(None, backend.wait_attempts, UNARY, 1, 5)
    started = time.monotonic()
    await channel.close(grace)
    took = time.monotonic() - started

    async def outcome(call):
        return call.cancelled(), await call.code(), await call.details()

    outcomes = {"quick": await outcome(quick), "held": await outcome(held), "stream": await outcome(stream)}
    try:
        unary(b"late")
        outcomes["after close"] = None
    except Exception as error:
        outcomes["after close"] = (type(error).__name__, str(error))
    return outcomes, took


@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
@pytest.mark.parametrize("grace", [None, 0.5])
async def test_aio_close_cancels_the_calls_in_flight_after_the_grace_as_grpc_aio_does(policy, grace):
    theirs_backend, ours_backend = Backend(), Backend()
    try:
        expected, theirs_took = await _aio_scenario(grpc.aio.insecure_channel, theirs_backend, "none", grace)
        outcomes, took = await _aio_scenario(grpc_retry.aio.insecure_channel, ours_backend, policy, grace)
        if GRPCIO < (1, 83):
            # grpc.aio's close before 1.83 cancels only the calls a task is awaiting: the idle stream is left to
            # fail when the channel goes. grpc_retry cancels every call, as grpc.aio does from 1.83.
            assert expected.pop("stream")[1] != grpc.StatusCode.OK
            assert outcomes.pop("stream") == (True, grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        assert outcomes == expected
        if grace is None:
            assert expected["quick"][1] == grpc.StatusCode.CANCELLED
            assert took < 0.1, f"close() took {took * 1000:.0f} ms"
        else:
            assert expected["quick"][1] == grpc.StatusCode.OK
            assert grace - 0.05 < took < grace + 0.25
        assert await no_tasks_left(), "a task outlived its channel"
        for attempt in ours_backend.wait_all_ended(UNARY, timeout=5):
            assert attempt.cancelled, "an attempt ran on at the server after its channel closed"
    finally:
        theirs_backend.stop()
        ours_backend.stop()


async def test_aio_close_ends_calls_in_backoff(backend):
    backend.fallback(UNARY, lambda i: fail())  # as in the sync test: a quick retry only fails again
    channel = grpc_retry.aio.insecure_channel(backend.target, options=options("retry"))
    call = channel.unary_unary(UNARY)(b"x", timeout=30)
    while call._machine.state_name != "BACKOFF":
        await asyncio.sleep(0.01)
    await channel.close()
    assert call.cancelled() and await call.code() == grpc.StatusCode.CANCELLED
    assert await no_tasks_left(), "a task outlived its channel"


def connections_to(port: int) -> int:
    """This process's established TCP connections to `port` (/proc/net/tcp*, state 01; C-core's sockets are IPv6
    ones with IPv4-mapped addresses)."""
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as rows:
            count += sum(1 for row in list(rows)[1:]
                         if row.split()[2].endswith(f":{port:04X}") and row.split()[3] == "01")
    return count


async def test_aio_close_closes_the_connections_even_with_an_ended_call_held(backend):
    """An attempt's C-core call keeps its subchannel's channel open in C-core, and with it the connection and the
    subchannel's state watch (grpc.aio before 1.71 hangs for good when its last channel is collected while a watch
    is pending). An ended attempt lets go of its C-core call: a closed channel's connections close, and its
    watches end, while the application still holds a call that ended."""
    backend.fallback(UNARY, lambda i: fail())
    channel = grpc_retry.aio.insecure_channel(backend.target, options=options("retry"))
    call = channel.unary_unary(UNARY)(b"x", timeout=30)
    while call._machine.state_name != "BACKOFF":  # its first attempt ended, the call held
        await asyncio.sleep(0.01)
    assert connections_to(backend.port) == 1
    await channel.close()
    assert call.cancelled() and await call.code() == grpc.StatusCode.CANCELLED
    deadline = time.monotonic() + 3
    while connections_to(backend.port) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # C-core closes it on its own threads
    assert connections_to(backend.port) == 0


@pytest.mark.parametrize("policy", ["none", "hedging"])
async def test_aio_channels_that_come_and_go_leave_no_thread_or_task(backend, policy):
    # Channels are made in frames of their own: grpc.aio's close before 1.83 reads every task's frame locals,
    # and the snapshot it leaves on a frame still running would keep the last channel alive.
    async def warm() -> None:
        async with grpc_retry.aio.insecure_channel(backend.target) as channel:  # grpc.aio's poller thread
            await channel.unary_unary(UNARY)(b"w")

    async def churn() -> None:
        for i in range(1000):
            channel = grpc_retry.aio.insecure_channel(backend.target, options=options(policy))
            call = channel.unary_unary(UNARY)(b"x", timeout=5)
            if i % 2:
                await call
            await channel.close()
            assert call.done()

    await warm()
    before = ours_threads()
    await churn()
    assert await no_tasks_left(), "a task outlived its channel"
    assert settle(lambda: ours_threads() <= before), sorted(t.name for t in ours_threads() - before)
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, grpc.aio.Channel)], "a subchannel outlived its channel"
