"""grpc.aio, side by side: the same scenario through grpc.aio.insecure_channel and through grpc_retry.aio's."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from typing import Any, List

import grpc
import pytest
from grpc import aio
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Step, fail
from support.deploy import free_port
from support.dropin import error_logs, side_by_side

HEADERS = (("h", "1"),)
TRAILERS = (("t", "2"),)


def same_as_grpc_aio(scenario, ours) -> Any:
    """Run `scenario(make, backend)` (a coroutine) through grpc.aio and through ours; the observations agree."""
    return side_by_side(lambda make, backend: asyncio.run(scenario(make, backend)), ours,
                        grpc.aio.insecure_channel)


async def outcome(awaitable) -> Any:
    try:
        return ("ok", await awaitable)
    except aio.AioRpcError as error:
        return ("error", error.code(), error.details(), tuple(error.initial_metadata() or ()),
                tuple(error.trailing_metadata() or ()))
    except asyncio.CancelledError:
        return ("CancelledError",)
    except Exception as error:
        return (type(error).__name__, str(error))


async def unary_results(make, backend) -> Any:
    backend.script(UNARY, Step(headers=HEADERS, trailing=TRAILERS), fail(grpc.StatusCode.NOT_FOUND, "no such",
                                                                        trailing=TRAILERS))
    async with make(backend.target) as channel:
        call = channel.unary_unary(UNARY)(b"a", metadata=(("k", "v"),), timeout=5)
        response = await call
        failed = channel.unary_unary(UNARY)(b"b", timeout=5)
        return (response, await call.code(), await call.details(), tuple(await call.initial_metadata()),
                tuple(await call.trailing_metadata()), await call.debug_error_string(), call.done(),
                call.cancelled(), await outcome(failed), await failed.code(), failed.done())


async def streams(make, backend) -> Any:
    backend.script(SERVER_STREAM, Step(headers=HEADERS, trailing=TRAILERS, responses=2))
    async with make(backend.target) as channel:
        stream = channel.unary_stream(SERVER_STREAM)(b"s", timeout=5)
        messages = [m async for m in stream]
        writer = channel.stream_unary(CLIENT_STREAM)(timeout=5)
        await writer.write(b"1")
        await writer.write(b"2")
        await writer.done_writing()
        after_done = await outcome(writer.write(b"3"))
        response = await writer
        on_finished = await outcome(writer.write(b"4"))
        bidi = channel.stream_stream(BIDI)(timeout=5)
        await bidi.write(b"x")
        first = await bidi.read()
        mixed = await outcome(_iterate(bidi))
        await bidi.done_writing()
        rest = await bidi.read()
        with_iterator = channel.stream_stream(BIDI)(iter([b"p", b"q"]), timeout=5)
        refused_write = await outcome(with_iterator.write(b"r"))
        ended = channel.stream_unary(CLIENT_STREAM)(timeout=5)
        ended.cancel()
        done_writing_ended = await outcome(ended.done_writing())  # a call already over: nothing to half-close
        return (messages, await stream.code(), tuple(await stream.initial_metadata()),
                tuple(await stream.trailing_metadata()), after_done, response, on_finished, first, mixed,
                rest is aio.EOF, refused_write, [m async for m in with_iterator], done_writing_ended)


async def _iterate(call) -> list:
    return [m async for m in call]


async def cancellation(make, backend) -> Any:
    backend.script(UNARY, Step(wait=0.3), Step(wait=0), Step(wait=0))
    async with make(backend.target) as channel:
        # Cancelling a task that waits for the status cancels that wait only.
        call = channel.unary_unary(UNARY)(b"a", timeout=5)
        waiter = asyncio.ensure_future(call.code())
        await asyncio.sleep(0.05)
        waiter.cancel()
        only_the_wait = (await outcome(waiter), await call, call.cancelled())
        # Cancelling a task blocked in `await call` cancels the call, done callback or not.
        call = channel.unary_unary(UNARY)(b"b", timeout=5)
        reported = asyncio.get_running_loop().create_future()
        call.add_done_callback(lambda c: reported.done() or reported.set_result(c.cancelled()))
        task = asyncio.ensure_future(_await(call))
        await asyncio.sleep(0.05)
        task.cancel()
        the_call = (await outcome(task), call.cancelled(), await call.code(), await reported)
        # call.cancel(), then every accessor.
        call = channel.unary_unary(UNARY)(b"c", timeout=5)
        await asyncio.sleep(0.05)
        cancelled = call.cancel()
        direct = (cancelled, call.cancel(), call.cancelled(), call.done(), await outcome(call), await call.code(),
                  await call.details(), await outcome(call.wait_for_connection()))
        return only_the_wait, the_call, direct


async def _await(call) -> Any:
    return await call


async def _read(call) -> Any:
    return await call.read()


_CONTEXT: contextvars.ContextVar[bytes] = contextvars.ContextVar("context")


async def waking_awaiting_tasks(make, backend) -> Any:
    """What a task sees as the call it awaits ends: the call's done callbacks have run, its context is its own;
    and several awaiting one call, through gather, wait_for and code()."""
    backend.script(UNARY, Step(headers=HEADERS, trailing=TRAILERS), fail(grpc.StatusCode.NOT_FOUND, "no such"))
    async with make(backend.target) as channel:
        seen = []
        for request in (b"a", b"b"):
            order: list = []
            call = channel.unary_unary(UNARY)(request, timeout=5)
            call.add_done_callback(lambda c, order=order: order.append(("callback", c.done())))
            _CONTEXT.set(request)
            ended = await outcome(call)
            order.append(("resumed", _CONTEXT.get(), call.done()))
            seen.append((ended, order))
        call = channel.unary_unary(UNARY)(b"c", timeout=5)
        together = await asyncio.gather(_await(call), call.code(), asyncio.wait_for(call, 5), _await(call))
        return seen, together


async def cancelling_blocked_tasks(make, backend) -> Any:
    """Cancelling the task blocked in `await call`, read() or `async for` cancels the call — also on a channel
    whose name has not resolved yet when the call is made, and on a call with a done callback."""
    backend.fallback(UNARY, lambda i: Step(wait=0))
    backend.fallback(SERVER_STREAM, lambda i: Step(wait=0))
    seen = []
    for target in (backend.target, f"localhost:{backend.port}"):
        async with make(target) as channel:
            for kind, wait in (("unary", _await), ("read", _read), ("iterate", _iterate)):
                call = channel.unary_unary(UNARY)(b"x", timeout=5) if kind == "unary" else \
                    channel.unary_stream(SERVER_STREAM)(b"y", timeout=5)
                call.add_done_callback(lambda c: None)
                task = asyncio.ensure_future(wait(call))
                for _ in range(3):
                    await asyncio.sleep(0)
                task.cancel()
                seen.append((kind, await outcome(task), call.cancelled(), await call.code()))
    return seen


async def deadlines_and_failures(make, backend) -> Any:
    backend.script(UNARY, Step(wait=0), fail())
    backend.script(SERVER_STREAM, Step(wait=0))
    async with make(backend.target) as channel:
        late = await outcome(channel.unary_unary(UNARY)(b"d", timeout=0.2))
        stream = channel.unary_stream(SERVER_STREAM)(b"e", timeout=0.2)
        streamed = await outcome(_iterate(stream))
        failed = channel.unary_unary(UNARY)(b"f", timeout=5)
        return (late, streamed, await stream.details(), await outcome(failed.wait_for_connection()),
                await outcome(failed))


async def request_streams_past_their_deadline(make, backend) -> Any:
    """Request-stream calls whose deadline passes before their answer: one the server never answers (the deadline
    alone ends it), one after the server's headers (its error carries them; its details are C-core's race, on
    grpc.aio too: "Deadline Exceeded" or "Stream removed (Deadline Exceeded)")."""
    hold = threading.Event()
    backend.script(CLIENT_STREAM, Step(wait=30))
    backend.script(BIDI, Step(code=grpc.StatusCode.ABORTED, responses=0, headers=HEADERS, gate=hold))
    try:
        async with make(backend.target) as channel:
            silent = channel.stream_unary(CLIENT_STREAM)(iter([b"a", b"b"]), timeout=0.2)
            answered = channel.stream_stream(BIDI)(iter([b"c"]), timeout=0.4)
            late = await outcome(_iterate(answered))
            return (await outcome(silent), await silent.code(), tuple(await silent.initial_metadata()),
                    late[:2] + late[3:], await answered.code(), tuple(await answered.initial_metadata()))
    finally:
        hold.set()


async def _failing_requests():
    yield b"a"
    raise ValueError("the application's iterator failed")


async def refusals(make, backend) -> Any:
    async with make(backend.target) as channel:
        async def with_call_credentials():
            return await channel.unary_unary(UNARY)(b"x", credentials=grpc.access_token_call_credentials("t"))

        failing = channel.stream_unary(CLIENT_STREAM)(_failing_requests(), timeout=5)
        return (await outcome(with_call_credentials()), await outcome(failing), await failing.code(),
                await failing.details(), failing.cancelled())


async def request_iterator_reads(make, backend) -> Any:
    """A request iterator is read as grpc.aio reads it: one message taken while the call's metadata cannot go out
    (nothing listens), or when the call has failed fast, and the rest once they went. Nothing says the iterator
    failed (grpc_retry logs that at DEBUG)."""
    taken = []

    def requests(name):
        for i in range(3):
            taken.append((name, i))
            yield b"%d" % i

    async def more(name):
        for request in requests(name):
            yield request

    failures, logger = _IteratorFailures(), logging.getLogger("grpc_retry")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(failures)
    try:
        async with make(f"127.0.0.1:{free_port(['127.0.0.1'])}") as channel:
            waiting = channel.stream_unary(CLIENT_STREAM)(requests("waiting"), timeout=0.3, wait_for_ready=True)
            unsent = [(await outcome(waiting))[:2]]
            for name, iterator in (("failing fast", requests), ("failing fast, async", more)):
                await _until(channel, grpc.ChannelConnectivity.TRANSIENT_FAILURE)
                unsent.append((await outcome(channel.stream_unary(CLIENT_STREAM)(iterator(name), timeout=5)))[:2])
        async with make(backend.target) as channel:
            answered = await outcome(channel.stream_unary(CLIENT_STREAM)(requests("answered"), timeout=5))
    finally:
        logger.removeHandler(failures)
        logger.setLevel(level)
    return unsent, answered, taken, failures.seen


class _IteratorFailures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "iterator failed" in record.getMessage():
            self.seen.append(record.getMessage())


async def time_remaining(make, backend) -> Any:
    async with make(backend.target) as channel:
        call = channel.unary_unary(UNARY)(b"t", timeout=10)
        remaining = call.time_remaining()
        unbounded = channel.unary_unary(UNARY)(b"u")
        await call, await unbounded
        return 9 < remaining <= 10, unbounded.time_remaining()


async def metadata_and_compression(make, backend) -> Any:
    async with make(backend.target) as channel:
        method = channel.unary_unary(UNARY)
        return (await outcome(method(b"z", metadata=(("k", "v"), ("x-bin", b"\x00")), timeout=5)),
                await outcome(method(b"z", compression=grpc.Compression.Gzip, timeout=5)),
                [tuple(a.metadata.items()) for a in backend.attempts_of(UNARY)][:1])


async def refused_metadata(make, backend) -> Any:
    """Metadata grpc.aio cannot send: each kind of call raises grpc.aio's error, where grpc.aio raises it."""
    backend.script(SERVER_STREAM, Step(responses=1))
    backend.script(BIDI, Step(responses=1))
    bad = (("k-bin", "not bytes"),)
    with error_logs() as errors:
        async with make(backend.target) as channel:
            calls = (channel.unary_unary(UNARY)(b"u", metadata=bad, timeout=5),
                     channel.unary_stream(SERVER_STREAM)(b"s", metadata=bad, timeout=5).read(),
                     channel.stream_unary(CLIENT_STREAM)(iter([b"c"]), metadata=(("k", 1),), timeout=5),
                     channel.stream_stream(BIDI)(iter([b"b"]), metadata=bad, timeout=5).read())
            return [await outcome(asyncio.wait_for(call, 5)) for call in calls], errors


class _Iterating(aio.UnaryStreamClientInterceptor):
    """Returns a response iterator, not the call; notes the type of the metadata it is given."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    async def intercept_unary_stream(self, continuation, details, request):
        self.seen.append(type(details.metadata).__name__)
        call = await continuation(details, request)

        async def responses():
            async for response in call:
                yield response
        return responses()


class _Streaming(aio.StreamStreamClientInterceptor):
    def __init__(self, seen: list) -> None:
        self.seen = seen

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        self.seen.append((type(details.metadata).__name__, details.method))  # bytes on grpc.aio (Sentry decodes it)
        return await continuation(details, request_iterator)


class _Unary(aio.UnaryUnaryClientInterceptor, aio.UnaryStreamClientInterceptor):
    """Both kinds: grpc.aio takes it as the first only."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    async def intercept_unary_unary(self, continuation, details, request):
        self.seen.append((type(details.metadata).__name__, details.method, details.method.decode()))
        return await continuation(details, request)

    async def intercept_unary_stream(self, continuation, details, request):
        self.seen.append("never")
        return await continuation(details, request)


async def interceptors(make, backend) -> Any:
    seen: list = []
    chain = [_Iterating(seen), _Streaming(seen), _Unary(seen)]
    async with make(backend.target, interceptors=chain) as channel:
        call = channel.unary_stream(SERVER_STREAM)(b"i", metadata=(("k", "v"),), timeout=5)
        ended = []
        call.add_done_callback(lambda c: ended.append(True))
        messages = [m async for m in call]
        whole = (messages, await call.code(), call.done(), call.cancel(), await outcome(call.wait_for_connection()))
        bidi = channel.stream_stream(BIDI)(timeout=5)
        await bidi.write(b"w")
        await bidi.done_writing()
        written = [m async for m in bidi]
        unary = await channel.unary_unary(UNARY)(b"u", metadata=(("k", "v"),))
        await asyncio.sleep(0.01)
        return whole, ended, written, unary, seen, await outcome(_refused(make, backend))


class _NotAnInterceptor:
    def __repr__(self) -> str:
        return "<not an interceptor>"


async def _refused(make, backend) -> Any:
    return make(backend.target, interceptors=[_NotAnInterceptor()])


async def closing(make, backend) -> Any:
    backend.script(UNARY, Step(wait=0))
    channel = make(backend.target)
    call = channel.unary_unary(UNARY)(b"held", timeout=30)
    await asyncio.get_running_loop().run_in_executor(None, backend.wait_attempts, UNARY, 1, 5)
    started = time.monotonic()
    await channel.close()
    took = time.monotonic() - started
    late = await outcome(_make_late(channel))
    return (call.cancelled(), await call.code(), await call.details(), took < 0.1, channel.get_state(), late)


async def state_after_close(make, backend) -> Any:
    """A wait in progress when the channel closes returns; one begun after the close is a usage error."""
    channel = make(backend.target)
    state = channel.get_state()
    waiting = asyncio.ensure_future(channel.wait_for_state_change(state))
    await asyncio.sleep(0.05)
    await channel.close()
    in_progress = await outcome(asyncio.wait_for(waiting, 5))
    after = [await outcome(channel.wait_for_state_change(s)) for s in (grpc.ChannelConnectivity.SHUTDOWN,
                                                                        grpc.ChannelConnectivity.IDLE)]
    return in_progress, after, channel.get_state(), channel.get_state(True)


async def _make_late(channel) -> Any:
    return channel.unary_unary(UNARY)(b"late")


async def connecting_new_channels(make, backend) -> Any:
    target = f"localhost:{backend.port}"  # resolved by name: the connect is asked for before it resolved
    ready = []
    for _ in range(5):
        async with make(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 5)
            ready.append(channel.get_state())
        async with make(target) as channel:
            channel.get_state(try_to_connect=True)
            state = channel.get_state()
            while state != grpc.ChannelConnectivity.READY:
                await asyncio.wait_for(channel.wait_for_state_change(state), 5)
                state = channel.get_state()
            ready.append(state)
    async with make("no-such-host.invalid:443") as channel:
        channel.get_state(try_to_connect=True)
        state = channel.get_state()
        while state in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING):
            await asyncio.wait_for(channel.wait_for_state_change(state), 20)
            state = channel.get_state()
        ready.append(state)
    return ready


async def failing_fast_then_writing(make, backend) -> Any:
    """A channel to a closed port: calls fail fast (UNAVAILABLE) in the words of the channel's LB policy with the
    connection's error; once it is in TRANSIENT_FAILURE, a new stream call's first write() raises the call's error
    (grpc.aio's call fails while sending its headers), the next one says the call is finished."""
    port = free_port(["127.0.0.1"])  # nobody listens there
    seen: List[Any] = []
    async with make(f"127.0.0.1:{port}") as channel:
        for wait_for_ready in (None, False):
            seen.append(await outcome(channel.unary_unary(UNARY)(b"u", timeout=5, wait_for_ready=wait_for_ready)))
            call = channel.stream_stream(BIDI)(timeout=5, wait_for_ready=wait_for_ready)
            first = await outcome(call.write(b"1"))
            seen.append((first[:3], await outcome(call.write(b"2")), await call.code()))
    async with make(f"127.0.0.1:{port}", options=[("grpc.lb_policy_name", "round_robin")]) as channel:
        for _ in range(2):  # in round_robin's words: trying to connect, then failing fast
            seen.append(await outcome(channel.unary_unary(UNARY)(b"u", timeout=5)))
            seen.append(await _until(channel, grpc.ChannelConnectivity.TRANSIENT_FAILURE))
    return repr(seen).replace(f":{port}:", ":PORT:")


async def _until(channel: Any, state: grpc.ChannelConnectivity) -> bool:
    """Until the channel is in `state` (within 5 s: False if not)."""
    async def reached() -> None:
        while (now := channel.get_state()) is not state:
            await channel.wait_for_state_change(now)

    try:
        await asyncio.wait_for(reached(), 5)
    except asyncio.TimeoutError:
        return False
    return True


class _WrappingRequests(aio.StreamUnaryClientInterceptor, aio.StreamStreamClientInterceptor):
    """Passes the call on with its requests read through a generator of its own (grpc's interceptor tests' shape);
    with `stall`, then holds the loop that long on its next turn (a collection, a busy machine)."""

    def __init__(self, stall: float = 0.0) -> None:
        self._stall = stall

    async def _wrapped(self, continuation, details, requests):
        async def relay():
            async for request in requests:
                yield request
        call = await continuation(details, relay())
        if self._stall:
            asyncio.get_running_loop().call_soon(time.sleep, self._stall)
        return call

    async def intercept_stream_unary(self, continuation, details, requests):
        return await self._wrapped(continuation, details, requests)

    async def intercept_stream_stream(self, continuation, details, requests):
        return await self._wrapped(continuation, details, requests)


async def unresolvable_name(make, backend) -> Any:
    """A name that does not resolve: unused, the channel stays IDLE; a stream call's first write waits for its
    headers to go out and raises the call's error; a call cancelled at once, or after one write through an
    interceptor, ends CANCELLED (the name's failure must not have ended it already: grpc's interceptor tests),
    also when the loop stalls past the name's failure just after the call began."""
    seen = []
    for _ in range(5):
        for interceptors in (None, [_WrappingRequests()], [_WrappingRequests(stall=0.05)]):
            for kind in ("stream_unary", "stream_stream"):
                # Uncancelled, through an interceptor (writes only queue there), how many writes go in before the
                # failure comes is a race on grpc.aio too.
                for writes_before_cancel in (0, 1) if interceptors else (0, 1, None):
                    channel = make("foo.invalid/bar", interceptors=interceptors)
                    call = getattr(channel, kind)(CLIENT_STREAM if kind == "stream_unary" else BIDI)()
                    steps = []
                    for i in range(3):
                        if i == writes_before_cancel:
                            steps.append(("cancel", call.cancel()))
                        # The details name the resolver's failure in its own words (README: differences).
                        steps.append((await outcome(call.write(b"w")))[:2])
                    seen.append((kind, bool(interceptors), writes_before_cancel, steps, await call.code()))
                    await channel.close()
    channel = make("foo.invalid/bar")
    await asyncio.sleep(0.05)  # nothing used it: nothing happens
    seen.append(channel.get_state())
    await channel.close()
    return seen


@pytest.mark.parametrize("scenario", [unary_results, streams, cancellation, waking_awaiting_tasks,
                                      cancelling_blocked_tasks, request_iterator_reads,
                                      deadlines_and_failures, request_streams_past_their_deadline, refusals,
                                      time_remaining, metadata_and_compression, refused_metadata, interceptors,
                                      closing, state_after_close,
                                      connecting_new_channels, failing_fast_then_writing, unresolvable_name],
                         ids=lambda f: f.__name__)
def test_same_as_grpc_aio(aio_channel, scenario):
    same_as_grpc_aio(scenario, aio_channel)


def test_a_channel_made_outside_a_loop_as_grpc_aio(aio_channel):
    """Outside a coroutine, a channel binds to the loop grpc.aio would (or fails as grpc.aio does, when there is
    none), and warns nothing."""
    import warnings

    outcomes = []
    for make in (grpc.aio.insecure_channel, aio_channel):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                make("127.0.0.1:1")
                outcomes.append("made")
            except RuntimeError as error:
                outcomes.append(str(error))
        assert not [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert outcomes[0] == outcomes[1]
