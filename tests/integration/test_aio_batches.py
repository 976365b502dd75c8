"""grpc_retry's asyncio attempts run grpcio's batches on grpc.aio's Cython calls with no asyncio future: each batch
stands in for the loop grpcio's completion queue hands its completion to (`_transport.batches._Batch`). These check
what that hand-over must keep: the thread callbacks run on, what a callback that fails does to the loop, and that a
batch no one waits for any more (its attempt cancelled, its loop closed) tells nothing. A task awaiting a call's end
waits on an `EndWaiter`, which a batch's completion wakes on its own loop turn: these check it behaves as the future
it stands in for."""

import asyncio
import contextvars
import threading

import grpc
import pytest
from support.backend import UNARY, Step

from grpc_retry._transport import batches, direct_aio
from grpc_retry._transport import grpc_private as internals
from grpc_retry._transport.ends import EndWaiter


def _method(channel: grpc.aio.Channel) -> direct_aio.AioMethod:
    return direct_aio.AioMethod(channel.unary_unary(UNARY), False)


def _attempt(method: direct_aio.AioMethod, request: bytes) -> direct_aio.AioAttempt:
    return method(request, timeout=10, metadata=(), credentials=None, wait_for_ready=None, compression=None)


async def test_a_batch_is_told_at_once_on_the_loop_and_through_it_from_another_thread(backends):
    """On the loop's thread a batch's completion is told at once (within grpcio's reading of its completion queue);
    off it (grpcio's poller, where the platform gives it no socket to wake the loop with), it is handed to the loop,
    as a future's would be."""
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(backends[0].target) as channel:
        method = _method(channel)
        call = method._channel.call(method._method, None, None, None, *method._handle)
        sending, receiving = internals.unary_ops(b"x", (), 0)
        batch = batches._Batch(call, sending + receiving, loop, True)
        told = loop.create_future()
        batch.done = lambda: told.set_result(threading.get_ident())
        assert await asyncio.wait_for(told, 10) == threading.get_ident()

        ran = loop.create_future()
        thread = threading.Thread(target=batch.call_soon_threadsafe,
                                  args=(lambda: ran.set_result(threading.get_ident()),))
        thread.start()
        thread.join()
        assert not ran.done()  # not run on that thread
        assert await asyncio.wait_for(ran, 10) == threading.get_ident()
        at_once = []
        batch.call_soon_threadsafe(at_once.append, 1)  # on the loop's thread: at once
        assert at_once == [1]


async def test_an_attempt_callback_that_raises_reaches_the_loop_exception_handler(backends):
    """Told at once inside grpcio's completion handling, an attempt's callback that raises is reported as the loop
    reports a done callback that raised, and the completions after it are still told."""
    loop = asyncio.get_running_loop()
    reported = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with grpc.aio.insecure_channel(backends[0].target) as channel:
            method = _method(channel)
            failing = _attempt(method, b"a")

            def fail(_):
                raise ValueError("scripted")

            failing.on_end = fail
            ended = loop.create_future()
            attempt = _attempt(method, b"b")
            attempt.on_end = ended.set_result
            assert await asyncio.wait_for(ended, 10) == b"b"
            while not failing.done():
                await asyncio.sleep(0.01)
            ours = [c for c in reported if isinstance(c.get("exception"), ValueError)]
            assert len(ours) == 1 and "batch callback failed" in ours[0]["message"]
            assert await failing.code() == grpc.StatusCode.OK
    finally:
        loop.set_exception_handler(None)


async def test_a_cancelled_attempt_ends_once_and_its_batch_is_never_told(backends):
    """Cancelled while its server holds it: it ends at once (EOF, CANCELLED), and the batch C-core completes later
    tells nothing."""
    backend = backends[0]
    backend.script(UNARY, Step(wait=30))
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(backend.target) as channel:
        attempt = _attempt(_method(channel), b"x")
        ends = []
        attempt.on_end = ends.append
        await asyncio.to_thread(backend.wait_for, lambda: len(backend.attempts_of(UNARY)) == 1)
        assert attempt.cancel()
        assert ends == [internals.EOF] and await attempt.code() == grpc.StatusCode.CANCELLED
        # The server sees the cancel, and C-core completes the batches, failed: nothing more is told.
        await asyncio.to_thread(backend.wait_for, lambda: backend.attempts_of(UNARY)[0].ended is not None)
        for _ in range(20):  # (its completion comes through grpcio's queue, a loop turn or two on)
            await asyncio.sleep(0.01)
        assert ends == [internals.EOF]
        assert not attempt.cancel()
    assert loop.is_running()


def test_a_batch_whose_loop_closed_completes_into_nothing(backends):
    """A batch left in flight when its loop closed completes later, read under another loop: it tells nothing, and
    that loop sees no error of the closed one's."""
    backend = backends[0]
    backend.script(UNARY, Step(wait=30))
    first = asyncio.new_event_loop()

    async def start():
        channel = grpc.aio.insecure_channel(backend.target)
        method = _method(channel)
        call = method._channel.call(method._method, None, None, None, *method._handle)
        sending, receiving = internals.unary_ops(b"x", (), 0)
        batch = batches._Batch(call, sending + receiving, asyncio.get_running_loop(), True)
        told = []
        batch.done = lambda: told.append(1)
        await asyncio.to_thread(backend.wait_for, lambda: len(backend.attempts_of(UNARY)) == 1)
        return channel, call, told

    channel, call, told = first.run_until_complete(start())
    first.close()

    async def then():
        reported = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
        async with grpc.aio.insecure_channel(backend.target) as other:
            call.cancel("its loop closed")
            await asyncio.to_thread(backend.wait_for, lambda: backend.attempts_of(UNARY)[0].ended is not None)
            for _ in range(3):  # calls whose completions the same queue reads
                assert await other.unary_unary(UNARY)(b"y") == b"y"
        return reported

    assert asyncio.run(then()) == []
    assert told == []
    del channel


def _batch(loop: asyncio.AbstractEventLoop, channel: grpc.aio.Channel) -> batches._Batch:
    method = _method(channel)
    call = method._channel.call(method._method, None, None, None, *method._handle)
    sending, receiving = internals.unary_ops(b"x", (), 0)
    return batches._Batch(call, sending + receiving, loop, True)


_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="none")


async def test_a_task_woken_by_a_batch_runs_as_that_batch_is_handled_in_its_own_context(backends):
    """Ended within a batch's completion (handed on by grpcio from a loop callback), a waiter wakes the task awaiting
    it as soon as that completion has been handled, before the loop's next callback, in the task's context. Ended
    anywhere else, or handed on inside a task, a loop turn later, as a future's."""
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(backends[0].target) as channel:
        batch = _batch(loop, channel)
        for how in ("from a loop callback", "inside a task", "not in a batch"):
            waiter = EndWaiter(loop)
            steps: list = []
            mine: list = []  # the task

            async def awaiting(waiter=waiter, steps=steps, mine=mine):
                _SEEN.set("the task's")
                steps.append("waiting")
                await waiter
                steps.append(("woken", _SEEN.get(), asyncio.current_task() is mine[0]))

            task = asyncio.ensure_future(awaiting())
            mine.append(task)
            await asyncio.sleep(0)
            assert steps == ["waiting"] and asyncio.isfuture(waiter) and not waiter.done()

            def end(waiter=waiter, steps=steps):
                waiter.set_result(None)
                steps.append("handled")  # the rest of the completion's handling comes first

            woken = ("woken", "the task's", True)
            if how == "inside a task":
                batch.call_soon_threadsafe(end)
                assert steps == ["waiting", "handled"]  # (a task cannot run inside another)
            else:
                next_callback = loop.create_future()
                if how == "from a loop callback":
                    loop.call_soon(batch.call_soon_threadsafe, end)  # as grpcio's reading of its queue
                else:
                    loop.call_soon(end)
                loop.call_soon(lambda steps=steps, seen=next_callback: seen.set_result(list(steps)))
                inline = [woken] if how == "from a loop callback" else []
                assert await next_callback == ["waiting", "handled", *inline]
            await task
            assert steps == ["waiting", "handled", woken]
            assert waiter.done() and not waiter.cancelled() and waiter.result() is None


async def test_a_waiter_cancelled_raises_in_its_task_as_a_future_does(backends):
    loop = asyncio.get_running_loop()
    waiter = EndWaiter(loop)

    async def awaiting():
        await waiter

    task = asyncio.ensure_future(awaiting())
    await asyncio.sleep(0)
    assert task.cancel("why")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiter.cancelled() and not waiter.cancel()
    with pytest.raises(asyncio.CancelledError, match="why"):
        waiter.result()
    with pytest.raises(asyncio.InvalidStateError):
        waiter.set_result(None)
    pending = EndWaiter(loop)
    with pytest.raises(asyncio.InvalidStateError):
        pending.result()
    called = loop.create_future()
    pending.add_done_callback(called.set_result)
    assert pending.remove_done_callback(called.set_result) == 1
    pending.set_result(None)
    await asyncio.sleep(0)
    assert not called.done()
    pending.add_done_callback(called.set_result)  # once done: a loop turn later, as a future's
    assert await called is pending
