"""The direct transport's proof of how grpcio hands out completions, made once per process and API, when the first
channel of that API is made (never at import): a loopback exchange with an in-process grpcio server, run through
the direct transport's own attempts, bounded by BOUND seconds. check.py proves the names and signatures the
transport uses; this proves the behaviour its attempts wait on, which no signature shows:

- sync: a call's own queue gives each of its batches' events to the thread that asks for it (`next_event()`: a
  blocking call, a polled hedged attempt); grpcio's channel thread calls the handler of a call its channel
  manages with each batch's event (a unary attempt, a hedged attempt's headers then its end), and the tag of a
  batch started later with `operate()` (a response stream's reads).
- asyncio: grpcio's `execute_batch` waits once on what the `loop` it is given makes, and grpcio hands the batch's
  completion to that loop's `call_soon_threadsafe`, on the thread of a loop reading grpcio's completions
  (`batches._Batch`); there the attempt is told at once and a task awaiting the call's end (`batches.EndWaiter`)
  wakes; a response stream's reads and a request stream's writes complete as its batches do.

A grpcio that does otherwise would leave attempts waiting for good: the channel's creation raises
CompletionCheckError instead, naming what did not happen, every time (the transport is chosen at import: it
cannot change under the channels already made). GRPC_RETRY_TRANSPORT=portable is the way out, and skips this.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from concurrent import futures
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import grpc

BOUND = 5.0  # seconds the whole exchange may take: a healthy one takes milliseconds
_SERVICE = "grpc_retry.CompletionCheck"
_UNARY, _STREAM, _UPLOAD = (f"/{_SERVICE}/{name}" for name in ("Unary", "Stream", "Upload"))
_REQUEST = b"ping"
_HEADERS = (("grpc-retry-check", "1"),)  # sent first, so that a hedged attempt's headers are told apart
_OPTIONS = (("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0))  # loopback, straight

_lock = threading.Lock()
_outcomes: Dict[str, str] = {}  # API ("sync", "aio") -> what failed ("": nothing)


class CompletionCheckError(RuntimeError):
    """The installed grpcio did not hand out completions as the direct transport relies on."""


def ensure(api: str) -> None:
    """(Each channel's creation.) Raise CompletionCheckError if the direct transport serves and the installed grpcio
    does not complete `api`'s ("sync" or "aio") attempts as it relies on; the exchange runs on the first one."""
    outcome = _outcomes.get(api)
    if outcome is None:
        from grpc_retry._transport import NAME

        with _lock:  # channels made at once on several threads wait for the one exchange
            outcome = _outcomes.get(api)
            if outcome is None:
                outcome = _outcomes[api] = _run(api) if NAME == "direct" else ""
    if outcome:
        raise CompletionCheckError(outcome)


class _Steps:
    """What the exchange is doing (its step), and how it ended, told across threads."""

    def __init__(self) -> None:
        self.step = "starting"
        self.error: Optional[BaseException] = None
        self.finished = threading.Event()
        self.deadline = time.monotonic() + BOUND

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class _NotTold(Exception):
    """A completion relied upon did not come within the bound."""


def _run(api: str) -> str:
    """What failed in one exchange for `api` ("": it went as relied upon)."""
    try:
        server, executor, target = _serve()
    except Exception as error:  # noqa: BLE001 - no loopback server here: nothing to prove with, nothing to stop
        warnings.warn(f"grpc_retry: the direct transport's completion check could not start a loopback server "
                      f"({error!r}): it did not run", RuntimeWarning, stacklevel=5)
        return ""
    steps = _Steps()
    exchange = _sync_exchange if api == "sync" else _aio_exchange
    thread = threading.Thread(target=_exchange, args=(exchange, target, steps), name="grpc_retry-completion-check",
                              daemon=True)  # left behind, should grpcio hold it for good
    done = False
    try:
        thread.start()
        done = steps.finished.wait(BOUND + 1.0)  # (its own waits end at BOUND: this for one stuck inside grpcio)
    finally:
        # Gone once it has returned (a channel made next may count the threads there are), unless left stuck. An
        # exchange that ended leaves no call: a graceful stop, whose GOAWAY carries no error, which grpcio would log
        # were it to reach the exchange's connection before that has closed.
        server.stop(BOUND if done else None).wait(BOUND)
        executor.shutdown(wait=done)
    if done and steps.error is None:
        return ""
    kind = "asyncio" if api == "aio" else "sync"
    if not done or isinstance(steps.error, _NotTold):
        what = f"{steps.step} did not happen within {BOUND:g}s"
    else:
        what = f"{steps.step} failed: {steps.error!r}"
    return (f"grpc_retry: grpcio {grpc.__version__} does not complete the direct transport's {kind} attempts as "
            f"it relies on: on a loopback exchange, {what}. Its attempts would wait for good: set "
            "GRPC_RETRY_TRANSPORT=portable to use grpcio's public API instead (more CPU per call).")


def _exchange(exchange: Callable[[str, _Steps], None], target: str, steps: _Steps) -> None:
    try:
        exchange(target, steps)
    except BaseException as error:  # noqa: BLE001 - told to the waiting thread, which raises its own error
        steps.error = error
    finally:
        steps.finished.set()


# -- the server ---------------------------------------------------------------------------------------------------


def _unary(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.send_initial_metadata(_HEADERS)
    return request


def _stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield request
    yield request


def _upload(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    return b"".join(requests)


def _serve() -> Tuple[grpc.Server, futures.ThreadPoolExecutor, str]:
    """A server of the exchange's methods on 127.0.0.1, its executor (stopping the server leaves it running), and
    its address."""
    executor = futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpc_retry-completion-check")
    server = grpc.server(executor, options=_OPTIONS)
    try:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
            "Stream": grpc.unary_stream_rpc_method_handler(_stream),
            "Upload": grpc.stream_unary_rpc_method_handler(_upload),
        }),))
        port = server.add_insecure_port("127.0.0.1:0")
        if not port:
            raise OSError("no port on 127.0.0.1")
        server.start()
    except BaseException:
        server.stop(None)
        executor.shutdown(wait=False)
        raise
    return server, executor, f"127.0.0.1:{port}"


def _expect(what: str, found: Any, wanted: Any) -> None:
    if found != wanted:
        raise AssertionError(f"{what}: {found!r}, not {wanted!r}")


# -- sync ---------------------------------------------------------------------------------------------------------


def _sync_exchange(target: str, steps: _Steps) -> None:
    from grpc_retry._transport import direct
    from grpc_retry._transport.direct_streams import SyncStreamAttempt

    channel = direct.new_sync_channel(target, _OPTIONS, None, None)
    try:
        unary: Any = channel.unary_unary(_UNARY)
        told: List[str] = []
        came = threading.Semaphore(0)

        def tell(what: str) -> Callable[[Any], None]:
            def on(_: Any) -> None:
                told.append(what)
                came.release()
            return on

        def wait(count: int) -> None:
            for _ in range(count):
                if not came.acquire(timeout=steps.left()):
                    raise _NotTold()

        steps.step = "a blocking unary call's batch event, taken on the caller's thread (next_event)"
        call, receiving = direct.sync_unary_start(unary, _REQUEST, steps.left(), (), None, None, None)
        ended = direct.sync_unary_end(call, receiving)
        _expect("its status and response", (ended._state.code, ended._state.response), (grpc.StatusCode.OK, _REQUEST))

        steps.step = "a unary attempt's end, told by grpcio's channel thread (a managed call's event handler)"
        attempt: Any = direct.SyncUnaryAttempt(unary, _REQUEST, timeout=steps.left(), metadata=(), credentials=None,
                                               wait_for_ready=None, compression=None, on_end=tell("end"))
        wait(1)
        _expect("its response", attempt._state.response, _REQUEST)

        steps.step = "a hedged attempt's headers, then its end, told by grpcio's channel thread (two batches)"
        told.clear()
        hedged = direct.SyncHeadersFirst(unary)
        attempt = hedged(_REQUEST, timeout=steps.left(), metadata=(), credentials=None, wait_for_ready=None,
                         compression=None, on_headers=tell("headers"), on_end=tell("end"))
        wait(2)
        _expect("what it told", told, ["headers", "end"])

        steps.step = "a polled hedged attempt's two batch events, taken on the caller's thread (next_event)"
        told.clear()
        attempt = hedged(_REQUEST, timeout=steps.left(), metadata=(), credentials=None, wait_for_ready=None,
                         compression=None, on_headers=tell("headers"), on_end=tell("end"), pollable=True)
        attempt.poll()
        _expect("what it told", told, ["headers", "end"])
        wait(2)

        steps.step = "a response stream's reads, each told to its tag by grpcio's channel thread (operate)"
        m: Any = channel.unary_stream(_STREAM)
        deadline = time.time() + steps.left()
        attempt = SyncStreamAttempt(m, _REQUEST, deadline, (), (), 0, None, tell("end"))
        # next() waits for each read's tag without a bound of its own: read on a thread of its own
        read: List[Any] = []

        def read_all() -> None:
            try:
                while True:
                    read.append(next(attempt))
            except StopIteration:
                pass
            except BaseException as error:  # noqa: BLE001 - what it read then tells it
                read.append(error)

        reader = threading.Thread(target=read_all, name="grpc_retry-completion-check-reader", daemon=True)
        reader.start()
        reader.join(steps.left())
        if reader.is_alive():
            raise _NotTold()
        _expect("what it read", read, [_REQUEST, _REQUEST])
        wait(1)
    finally:
        direct.close_sync_channel(channel)


# -- asyncio ------------------------------------------------------------------------------------------------------


def _aio_exchange(target: str, steps: _Steps) -> None:
    """On a loop of its own, on this thread: the channel being made may be made on a running loop, which this
    blocks (grpcio reads its completions on every loop bound to it: this one reads them meanwhile)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_aio_attempts(target, steps))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _aio_attempts(target: str, steps: _Steps) -> None:
    from grpc_retry._transport.direct import new_aio_channel
    from grpc_retry._transport.direct_aio import AioMethod, AioResponseStream
    from grpc_retry._transport.ends import EndWaiter
    from grpc_retry._transport.grpc_private import EOF

    loop = asyncio.get_running_loop()
    here = threading.get_ident()
    channel = new_aio_channel(target, _OPTIONS, None, None)
    told: List[Any] = []

    def on(what: str, wake: Any = None) -> Callable[..., None]:
        """What tells `what`, with its arguments, and wakes `wake` (an asyncio future, or an EndWaiter)."""
        def tell(*args: Any) -> None:
            # asyncio objects are touched only on their loop's thread
            told.append(what if threading.get_ident() == here else f"{what}, on another thread")
            told.extend(args)
            if wake is not None and not wake.done():
                wake.set_result(None)
        return tell

    async def until(waiter: Any) -> Any:
        return await waiter

    async def wait(waiter: Any) -> Any:
        try:
            return await asyncio.wait_for(until(waiter), steps.left())
        except asyncio.TimeoutError:
            raise _NotTold() from None

    def attempt(method: Any, request: Optional[bytes]) -> Any:
        return method(request, timeout=steps.left(), metadata=(), credentials=None, wait_for_ready=None,
                      compression=None)

    try:
        steps.step = ("an asyncio unary attempt's batch completion, handed to it on its loop's thread, waking the "
                      "task that awaits its end")
        ended = EndWaiter(loop)
        unary = attempt(AioMethod(channel.unary_unary(_UNARY), False), _REQUEST)
        unary.on_end = on("end", ended)
        await wait(ended)
        _expect("what it told", told, ["end", _REQUEST])

        steps.step = "an asyncio hedged attempt's headers, then its end (two batches)"
        told.clear()
        end = loop.create_future()
        hedged = attempt(AioMethod(channel.unary_unary(_UNARY), True), _REQUEST)
        hedged.on_headers, hedged.on_end = on("headers"), on("end", end)
        await wait(end)
        _expect("what it told", told, ["headers", "end", _REQUEST])

        steps.step = "an asyncio response stream's reads, then its end"
        told.clear()
        end = loop.create_future()
        stream = attempt(AioResponseStream(channel.unary_stream(_STREAM)), _REQUEST)
        stream.on_end = on("end", end)
        read = []
        for _ in range(3):
            reading = stream.read()
            read.append(EOF if reading is None else await wait(reading))
        await wait(end)
        _expect("what it read", read, [_REQUEST, _REQUEST, EOF])
        _expect("what it told", told, ["end", EOF])

        steps.step = "an asyncio request stream's metadata, message and half-close, then its end"
        told.clear()
        sent, written, end = loop.create_future(), loop.create_future(), loop.create_future()
        upload = attempt(AioMethod(channel.stream_unary(_UPLOAD), False), None)
        upload.on_sent, upload.on_written, upload.on_end = on("sent", sent), on("written", written), on("end", end)
        await wait(sent)
        upload.write(_REQUEST)
        await wait(written)
        upload.half_close()
        await wait(end)
        _expect("what it told", told, ["sent", "written", "end", _REQUEST])
    finally:
        await channel.close()
