"""The portable transport's asyncio attempts: grpc.aio calls made by grpc.aio's public multicallables (`None`
serializers), each followed by a task of its own that tells the driver what the call did, as the direct
transport's AioAttempt tells it from its batches (same interface: direct_aio.py)."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Awaitable, Deque, Optional, Tuple, Type

import grpc
from grpc.aio import AioRpcError

from grpc_retry._driver import INTERNAL_DETAILS
from grpc_retry._transport import direct_aio
from grpc_retry._transport.ends import AioAttemptBase

EOF = grpc.aio.EOF
_RESPONSE_STREAMS = ("unary_stream", "stream_stream")
_LOCALLY_CANCELLED = "Locally cancelled by application!"  # grpc.aio's words, as its own calls' cancel()
_HALF_CLOSE = object()
_CORE_ERROR = "Internal error from Core"  # grpc.aio's status for a batch C-core refused
_CODES = {code.value[0]: code for code in grpc.StatusCode}
# A unary attempt that shows its headers first is a streaming call of grpcio's, several times a one-batch
# attempt's cost (and on the sync API a timed one's timer runs on the timer thread): a watched method samples its
# calls 8 times more rarely than on the direct transport (both APIs).
WATCH_SPACING = 8
REAL_STATUS_TURNS = 100  # how long (ms) a status grpc.aio made up is given to be replaced by the call's own
_log = logging.getLogger("grpc_retry")


def _batch_errors() -> Tuple[Type[BaseException], ...]:
    """grpcio's error for a batch C-core refused, which done_writing() lets through on a call that has just ended:
    a private name, so looked up where this grpcio has it, not relied on."""
    cygrpc = getattr(getattr(grpc, "_cython", None), "cygrpc", None)
    error = getattr(cygrpc, "InternalError", None)
    return (error,) if isinstance(error, type) and issubclass(error, BaseException) else ()


# What grpc.aio's write() and done_writing() raise once the call is over: its end says how. (A locally cancelled
# call's write raises CancelledError, which ends the writer's task as it is.)
_CALL_OVER = (AioRpcError, asyncio.InvalidStateError) + _batch_errors()


class AioAttempts:
    """Every asyncio attempt is an AioAttempt, shaped as the direct transport's (its table); a hedged call's unary
    response comes through a stream call, whose headers show before its response."""

    shape = staticmethod(direct_aio.AioAttempts.shape)
    watch_spacing = WATCH_SPACING

    @staticmethod
    def method(channel: Any, name: str, shape: Tuple[str, bool, bool], owner: Any) -> AioMethod:
        return AioMethod(channel, name, shape[0], shape[2])


class AioMethod:
    """A method on one subchannel: it makes AioAttempts, called as grpc.aio's multicallable is (with bytes, or None
    for a request stream). `whole`: the same method with its headers shown with its response."""

    __slots__ = ("_multicallable", "_request_stream", "_stream", "_headers_first", "whole")

    def __init__(self, channel: Any, name: str, kind: str, headers_first: bool) -> None:
        self._stream = kind in _RESPONSE_STREAMS
        self._request_stream = kind.startswith("stream")
        self._headers_first = headers_first or self._stream
        self.whole = AioMethod(channel, name, kind, False) if headers_first and not self._stream else self
        if headers_first and not self._stream:  # grpc.aio shows a unary response's headers only with it
            kind = "stream_stream" if self._request_stream else "unary_stream"
        self._multicallable = getattr(channel, kind)(name)

    def __call__(self, request: Optional[bytes], *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> AioAttempt:
        call = self._multicallable(None if self._request_stream else request, timeout=timeout, metadata=metadata,
                                   credentials=credentials, wait_for_ready=wait_for_ready, compression=compression)
        return AioAttempt(call, self._headers_first, self._stream, self._request_stream)


class _Status:
    """An attempt's final status, as the driver reads it (aio_status()): its code a number, as C-core's."""

    __slots__ = ("_code", "_details", "_trailing", "_debug")

    def __init__(self, code: int, details: Optional[str], trailing: Tuple[Any, ...], debug: Optional[str]) -> None:
        self._code, self._details, self._trailing, self._debug = code, details, trailing, debug

    def code(self) -> int:
        return self._code

    def details(self) -> Optional[str]:
        return self._details

    def trailing_metadata(self) -> Tuple[Any, ...]:
        return self._trailing

    def debug_error_string(self) -> Optional[str]:
        return self._debug


class AioAttempt(AioAttemptBase):
    """One attempt: a grpc.aio call, and the task that follows it. It tells the driver `on_sent()` once a request
    stream's metadata went out, `on_headers()` when the response headers came (a response stream, or a unary
    response shown headers first), `on_written()` once a message written went, `on_end(response or EOF)` when
    it ended, then its done callbacks. A response stream's messages are read by the driver (read()). Its status
    and headers, its waiters and done callbacks are kept as the direct transport's are (AioAttemptBase)."""

    __slots__ = ("_headers_first", "_stream", "_task", "_outbox", "_sender", "_more", "_first", "_held", "_told",
                 "refusal")

    def __init__(self, call: Any, headers_first: bool, stream: bool, request_stream: bool) -> None:
        super().__init__(call, asyncio.get_running_loop(), request_stream)
        self._headers_first = headers_first
        self._stream = stream
        self._outbox: Deque[Any] = collections.deque()  # a request stream's messages and half-close, to send
        self._sender: Optional[asyncio.Task[None]] = None
        self._more: Optional[asyncio.Future[None]] = None  # what a writer waiting for the next message awaits
        self._told: Optional[_Status] = None  # the status grpc.aio told first (see _ended)
        self.refusal: Optional[BaseException] = None  # what grpc.aio raised instead of making the call
        # A stream-stream call's first read, started now: the only wait on which grpc.aio raises its refusal of
        # such a call. The driver's first read() awaits it.
        self._first: Optional[asyncio.Task[Any]] = None
        self._held: Optional[asyncio.Future[None]] = None  # the end, held until the driver reads _first's message
        if request_stream and headers_first:
            self._first = self._loop.create_task(call.read())
            self._first.add_done_callback(_retrieved)
        self._task: Optional[asyncio.Task[None]] = self._loop.create_task(self._follow())
        call.add_done_callback(self._ended)
        if request_stream and not stream and not headers_first:
            # A unary response is awaited at once (grpc.aio raises its refusal of the call there): the writer
            # watches the metadata go out, then sends each message as it comes, to the half-close.
            self._sender = self._loop.create_task(self._send_all(True))

    def _ended(self, call: Any) -> None:
        """grpc.aio set the call's status: it is read now. A write C-core refuses once the call has ended has
        grpc.aio set a status of its own over it (INTERNAL) a moment later. (grpc.aio 1.60 tells its done callbacks
        of each status set: the first real one is kept.)"""
        told = self._told
        if told is not None and not (told.code() == 13 and told.details() == _CORE_ERROR):
            return
        try:
            code = _now(_code_of(call))
            self._told = _Status(code.value[0], _now(call.details()), tuple(_now(call.trailing_metadata()) or ()),
                                 None if code is grpc.StatusCode.OK else _now(call.debug_error_string()))
        except Exception:  # (_NotYet: it would wait) read as the call's task ends instead; nothing may raise here
            pass

    async def _follow(self) -> None:
        call = self._call
        response: Any = EOF
        try:
            if self._first is not None:
                sent = self._loop.create_task(self._until_sent())
                first = self._first
                try:
                    await asyncio.wait((sent, first), return_when=asyncio.FIRST_COMPLETED)
                    if first.done() and not first.cancelled() and first.exception() is not None:
                        raise first.exception()  # type: ignore[misc]
                    await sent
                finally:
                    if not sent.done():
                        sent.cancel()
            elif self._request_stream and (self._stream or self._headers_first):
                await self._until_sent()
            elif self._headers_first:
                await call.wait_for_connection()  # (a unary-stream call: it raises grpc.aio's refusal)
            if self._headers_first:
                metadata = tuple(await call.initial_metadata())
                if self._status is None:
                    self._set_headers(metadata)
                    if self.on_headers is not None and (metadata or not call.done()):
                        self.on_headers()
            if not self._stream:
                if self._headers_first:
                    message = await (call.read() if self._first is None else self._first)
                    if message is not EOF and self._status is None:
                        response = message
                else:
                    response = await call
            await call.code()
        except AioRpcError:
            response = EOF
        except asyncio.CancelledError:
            if self._status is not None:
                return  # cancelled by cancel(): it ended there
            raise
        except Exception as error:
            if not call.done():  # grpc.aio refused the call (metadata it cannot send): the driver raises this
                if self._status is None:
                    self.refusal = error
                    self._task = None
                    self._set_status(_Status(13, f"grpc_retry could not start an attempt: {error!r}", (), None))
                    self._end(EOF)
                return
            # else it ended, and grpc.aio failed reading how (a status code it does not know): read below
        if self._status is None and self._stream and self._first is not None:
            await self._hold_for_first(self._first)
        if self._status is not None:
            return
        status = self._told
        if status is None or status.code() == 13 and status.details() == _CORE_ERROR:
            code = await _code_of(call)
            if code is grpc.StatusCode.INTERNAL and await call.details() == _CORE_ERROR:
                code = await self._real_status()
            status = _Status(code.value[0], await call.details(), tuple(await call.trailing_metadata() or ()),
                             None if code is grpc.StatusCode.OK else await call.debug_error_string())
        code = _CODES[status.code()]
        self._set_headers(tuple(await call.initial_metadata() or ()))
        self._locally_cancelled = code is grpc.StatusCode.CANCELLED and call.cancelled()
        self._task = None
        self._set_status(status)
        self._end(response)

    async def _hold_for_first(self, first: asyncio.Task[Any]) -> None:
        """The call ended before the driver read the message the first read took. C-core holds a call's status
        until its messages are read, or its deadline passes: so does the attempt hold its end, until the driver
        reads that message (read()), which commits the call first, as on grpcio."""
        if not first.done():
            await asyncio.wait((first,))  # (soon: the call is over)
        if self._first is first and not first.cancelled() and first.exception() is None and first.result() is not EOF:
            self._held = self._loop.create_future()
            await asyncio.wait((self._held,), timeout=self._call.time_remaining())
            self._held = None

    async def _real_status(self) -> grpc.StatusCode:
        """A write that C-core refused (the call had ended) has grpc.aio set a status of its own, INTERNAL, which
        the call's real status replaces as it arrives (at once: it is why the write failed)."""
        call = self._call
        for _ in range(REAL_STATUS_TURNS):
            await asyncio.sleep(0.001)
            code = await _code_of(call)
            if code is not grpc.StatusCode.INTERNAL or await call.details() != _CORE_ERROR:
                return code
        return grpc.StatusCode.INTERNAL

    async def _until_sent(self) -> None:
        """Until the request stream's metadata went out: then `on_sent()`."""
        call = self._call
        try:
            await call.wait_for_connection()
        except AioRpcError:
            return  # it ended first: its end says how
        if self._status is None and not call.done():
            self._tell_sent()

    def write(self, data: bytes) -> None:
        """Send a message of the request stream: `on_written()` once it went. One at a time."""
        self._send(data)

    def half_close(self) -> None:
        """Half-close the request stream, after the messages written."""
        self._send(_HALF_CLOSE)

    def _send(self, item: Any) -> None:
        if self._status is not None:
            return
        self._outbox.append(item)
        more = self._more
        if more is not None:
            self._more = None
            more.set_result(None)
        elif self._sender is None:
            self._sender = self._loop.create_task(self._send_all(False))

    async def _send_all(self, whole: bool) -> None:
        """Each message (and the half-close) in order, one at a time: grpc.aio's write() and done_writing() must
        not overlap. `whole`: first until the metadata went out, and to the half-close (a message not yet
        written is awaited), else until none is left to send."""
        call = self._call
        try:
            if whole:
                await self._until_sent()
            while self._status is None:
                if not self._outbox:
                    if not whole:
                        return
                    self._more = self._loop.create_future()
                    await self._more
                    continue
                item = self._outbox.popleft()
                try:
                    if item is _HALF_CLOSE:
                        await call.done_writing()
                        return
                    await call.write(item)
                except _CALL_OVER:
                    return
                if self._status is None and self.on_written is not None:
                    self.on_written()
        except Exception:  # a bug (the driver's on_written, say): nobody awaits this task to see it
            _log.exception("grpc_retry: an attempt's writer failed")
            self._failed()
        finally:
            self._sender = None

    def _failed(self) -> None:
        """The attempt's own task met a bug: it ends INTERNAL, its grpc.aio call cancelled, so that the driver
        hears of it as of any end instead of waiting for what will never be told."""
        if self._status is not None:
            return
        self._call.cancel()
        self._set_status(_Status(13, INTERNAL_DETAILS, (), None))
        for task in (self._task, self._first):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._task = self._first = None
        self._end(EOF)

    def _end(self, response: Any) -> None:
        self._outbox.clear()
        more, self._more = self._more, None
        sender = self._sender
        if more is not None:
            if not more.done():  # (else cancelled with its writer)
                more.set_result(None)  # (its writer, waiting for a message, sees the end and stops)
        elif not self.sent and sender is not None and sender is not asyncio.current_task():
            sender.cancel()  # (waiting for metadata that will never go out: grpc.aio refused the call)
        # Ended, it needs its grpc.aio call no more: an ended call the application keeps must not keep the channel
        # open in C-core after its close, and with it the connection.
        self._call = None
        self._tell_end(response)

    def read(self) -> Optional[Awaitable[Any]]:
        """A response stream's next message, to await (EOF once the stream ended), or None once the attempt has
        ended."""
        first = self._first
        if first is not None:
            self._first = None
            held, self._held = self._held, None
            if held is not None:
                held.set_result(None)  # (its end follows the message, a loop turn later)
            return self._read(first)
        if self._status is not None:
            return None
        return self._read()

    async def _read(self, first: Optional[asyncio.Task[Any]] = None) -> Any:
        try:
            return await (self._call.read() if first is None else first)
        except asyncio.CancelledError:
            # grpc.aio's read of a call cancelled meanwhile (cancel(): the attempt ended) ends as the stream's end;
            # the reading task's own cancellation goes on.
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)
            if self._status is not None and cancelling is not None and not cancelling():
                return EOF
            raise

    def _cancelled(self) -> None:
        self._call.cancel()
        self._set_status(_Status(1, _LOCALLY_CANCELLED, (), None))
        for task in (self._task, self._sender, self._first):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._task = self._sender = self._first = None
        self._end(EOF)


async def _code_of(call: Any) -> grpc.StatusCode:
    """An ended call's status code; UNKNOWN for one gRPC does not define (grpc.aio 1.60 raises KeyError)."""
    try:
        return await call.code()  # type: ignore[no-any-return]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


class _NotYet(Exception):
    pass


def _now(coroutine: Any) -> Any:
    """What one of grpc.aio's accessors of an ended call returns: its coroutine finishes without waiting (else
    _NotYet)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise _NotYet()


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def aio_intercepted(kind: str) -> type:
    """grpc.aio's intercepted call class for `kind`: the direct transport's, which runs grpc.aio's own interceptor
    classes, where the installed grpcio has them as grpc_retry knows them; else one that refuses to be made."""
    from grpc_retry._transport import check

    missing = check.interceptor_failures()
    if not missing:
        return direct_aio.aio_intercepted(kind)
    reason = (f"grpc_retry cannot run grpc.aio interceptors on grpcio {grpc.__version__}: {'; '.join(missing)}. "
              "Intercept the calls above the channel instead, or install a grpcio grpc_retry knows.")

    class Refused:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError(reason)

    return Refused
