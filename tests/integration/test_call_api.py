"""The call objects and channels behave as grpcio's do: what a drop-in replacement owes its users."""

import asyncio
import threading

import grpc
import pytest
from support.backend import SERVER_STREAM, UNARY, Step, fail
from support.clients import retry_options, retry_policy

import grpc_retry
import grpc_retry.aio
from grpc_retry._timer import TIMERS

# -- sync ------------------------------------------------------------------------------------------------


def test_sync_with_call_gives_a_finished_call(backend):
    backend.script(UNARY, fail(), Step(headers=(("x-h", "1"),), trailing=(("x-t", "2"),)))
    with grpc_retry.insecure_channel(backend.target, options=retry_options()) as channel:
        response, call = channel.unary_unary(UNARY).with_call(b"x", timeout=10)
    assert response == b"x"
    assert call.code() == grpc.StatusCode.OK
    assert dict(call.initial_metadata())["x-h"] == "1"
    assert dict(call.trailing_metadata()) == {"x-t": "2", "grpc-previous-rpc-attempts": "1"}
    assert not call.is_active()
    stats = channel.retry_stats()[UNARY]
    assert (stats.retries, stats.retry_attempts_failed) == (1, 0)


def test_sync_errors_are_rpc_errors_and_calls(backend):
    backend.script(UNARY, fail(grpc.StatusCode.NOT_FOUND, "nope", trailing=(("x-t", "2"),)))
    channel = grpc_retry.insecure_channel(backend.target, options=retry_options())
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(UNARY)(b"x", timeout=10)
    error = info.value
    assert isinstance(error, grpc.Call)
    assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, "nope")
    assert dict(error.trailing_metadata())["x-t"] == "2"
    channel.close()


def test_sync_future_and_its_callbacks(backend):
    gate = threading.Event()
    backend.script(UNARY, Step(gate=gate))
    channel = grpc_retry.insecure_channel(backend.target, options=retry_options())
    future = channel.unary_unary(UNARY).future(b"x", timeout=30)
    assert future.running() and future.is_active() and not future.done()
    assert 0 < future.time_remaining() <= 30
    ended = threading.Event()
    assert future.add_callback(ended.set)
    done = []
    future.add_done_callback(done.append)
    gate.set()
    assert future.result(10) == b"x"
    assert ended.wait(10)
    assert done == [future] and future.done() and future.code() == grpc.StatusCode.OK
    assert not future.add_callback(lambda: None)  # already over, as grpcio says
    channel.close()


def test_sync_close_ends_every_call_and_timer(backend):
    backend.fallback(UNARY, lambda i: fail())
    backend.script(SERVER_STREAM, Step(wait=0))
    channel = grpc_retry.insecure_channel(
        backend.target, options=retry_options(retry_policy(initial="30s", maximum="30s")))
    channel._state.rng = lambda: 1.0
    future = channel.unary_unary(UNARY).future(b"x", timeout=60)
    stream = channel.unary_stream(SERVER_STREAM)(b"x", timeout=60)
    backend.wait_ended(UNARY, 1)
    backend.wait_attempts(SERVER_STREAM, 1)
    channel.close()
    error = future.exception(10)  # as grpcio: the channel's close is an error, not the application's cancel
    assert error.code() == grpc.StatusCode.CANCELLED and not future.cancelled()
    with pytest.raises(grpc.RpcError) as info:
        next(stream)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    assert TIMERS.pending() == 0
    assert len(backend.attempts_of(UNARY)) == 1


def test_sync_subscribe_reports_connectivity(backend):
    channel = grpc_retry.insecure_channel(backend.target)
    states = []
    ready = threading.Event()

    def on_state(state):
        states.append(state)
        if state == grpc.ChannelConnectivity.READY:
            ready.set()

    channel.subscribe(on_state, try_to_connect=True)
    assert ready.wait(10), states
    channel.unsubscribe(on_state)
    channel.close()


def test_sync_stream_iterator_is_a_call(backend):
    backend.script(SERVER_STREAM, fail(), Step(headers=(("x-h", "1"),)))
    channel = grpc_retry.insecure_channel(backend.target, options=retry_options())
    stream = channel.unary_stream(SERVER_STREAM)(b"x", timeout=10)
    assert dict(stream.initial_metadata())["x-h"] == "1"
    assert list(stream) == [b"x#0", b"x#1", b"x#2"]
    assert stream.code() == grpc.StatusCode.OK
    assert dict(stream.trailing_metadata())["grpc-previous-rpc-attempts"] == "1"
    channel.close()


def test_sync_intercept_channel(backend):
    seen = []

    class Interceptor(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            seen.append(details.method)
            return continuation(details, request)

    backend.script(UNARY, fail())
    channel = grpc.intercept_channel(grpc_retry.insecure_channel(backend.target, options=retry_options()),
                                     Interceptor())
    assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen == [UNARY] and len(backend.attempts_of(UNARY)) == 2
    channel.close()


# -- aio -------------------------------------------------------------------------------------------------


async def test_aio_call_accessors(backend):
    backend.script(UNARY, fail(), Step(headers=(("x-h", "1"),), trailing=(("x-t", "2"),)))
    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as channel:
        call = channel.unary_unary(UNARY)(b"x", timeout=10)
        assert await call == b"x"
        assert await call.code() == grpc.StatusCode.OK
        # Pairs, not dict(metadata): grpc.aio.Metadata's keys() yields pairs before grpcio 1.80.
        assert dict(tuple(await call.initial_metadata()))["x-h"] == "1"
        assert dict(tuple(await call.trailing_metadata())) == {"x-t": "2", "grpc-previous-rpc-attempts": "1"}
        assert call.done() and not call.cancelled()
        stats = channel.retry_stats()[UNARY]
        assert (stats.retries, stats.retry_attempts_failed) == (1, 0)


async def test_aio_error_is_an_aio_rpc_error(backend):
    backend.script(UNARY, fail(grpc.StatusCode.NOT_FOUND, "nope"))
    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary(UNARY)(b"x", timeout=10)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, "nope")


async def test_aio_cancel_raises_cancelled_error_as_grpc_aio_does(backend):
    backend.script(UNARY, Step(wait=0))
    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as channel:
        call = channel.unary_unary(UNARY)(b"x", timeout=30)
        await asyncio.get_running_loop().run_in_executor(None, backend.wait_attempts, UNARY, 1)
        assert call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert call.cancelled() and await call.code() == grpc.StatusCode.CANCELLED


async def test_aio_channel_ready_and_state(backend):
    async with grpc_retry.aio.insecure_channel(backend.target) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        assert channel.get_state() == grpc.ChannelConnectivity.READY


async def test_aio_stream_write_and_done_writing(backend):
    from support.backend import BIDI

    backend.script(BIDI, fail(read=2, read_all=True))
    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as channel:
        call = channel.stream_stream(BIDI)(timeout=10)
        await call.write(b"a")
        await call.write(b"b")
        await call.done_writing()
        assert [m async for m in call] == [b"a", b"b"]
        assert await call.code() == grpc.StatusCode.OK
    assert [a.requests for a in backend.attempts_of(BIDI)] == [[b"a", b"b"], [b"a", b"b"]]
