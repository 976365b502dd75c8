"""grpc_retry's asyncio attempts run grpcio's batches on grpc.aio's Cython calls with no asyncio future: each batch
stands in for the loop grpcio's completion queue hands its completion to (`_grpc_internals._Batch`). These check
what that hand-over must keep: the thread callbacks run on, and what a callback that fails does to the loop."""

import asyncio
import threading

import grpc
from support.backend import UNARY, Step

from grpc_retry import _grpc_internals as internals


def _method(channel: grpc.aio.Channel) -> internals.AioMethod:
    return internals.AioMethod(channel.unary_unary(UNARY), False)


def _attempt(method: internals.AioMethod, request: bytes) -> internals.AioAttempt:
    return method(request, timeout=10, metadata=(), credentials=None, wait_for_ready=None, compression=None)


async def test_a_completion_handed_over_from_another_thread_runs_on_the_loop(backends):
    """Off the loop's thread (grpcio's poller, where the platform gives it no socket to wake the loop with), a
    batch hands its completion to the loop, as a future's would be."""
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(backends[0].target) as channel:
        method = _method(channel)
        attempt = _attempt(method, b"x")
        ended = loop.create_future()
        attempt.on_end = ended.set_result
        assert await asyncio.wait_for(ended, 10) == b"x"
        # A batch of its own, to hand something over: it is never told (its call is cancelled).
        call = method._channel.call(method._method, None, None, None, *method._handle)
        batch = internals._Batch(call, (internals.ReceiveInitialMetadataOperation(0),), loop, True)
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
        call.cancel("done with it")  # (its batch completes, failed, into nothing: no one waits for it)


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
            assert [type(c.get("exception")) for c in reported] == [ValueError]
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
