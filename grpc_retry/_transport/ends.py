"""What either transport's attempts leave when they end, read the same way by the drivers: a sync attempt's state
(named as grpcio's call state names it), an asyncio attempt's status and headers (kept by `AioAttemptBase`, what
both transports' asyncio attempts share), and what a task awaiting an asyncio call's end waits on (`EndWaiter`).
Nothing here touches grpcio's private names (grpc_private.py)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from functools import partial
from typing import Any, Callable, List, Optional, Tuple

import grpc

Metadata = Tuple[Any, ...]  # (key, value) pairs
_current_task = asyncio.current_task


# -- sync attempts ----------------------------------------------------------------------------------------------

class AttemptState:
    """What a sync attempt's end leaves, named as grpcio's call state names it (what sync_status() reads)."""

    __slots__ = ("code", "details", "initial_metadata", "trailing_metadata", "debug_error_string", "response")

    def __init__(self) -> None:
        self.code: Optional[grpc.StatusCode] = None
        self.details: Optional[str] = None
        self.initial_metadata: Optional[Metadata] = None
        self.trailing_metadata: Metadata = ()
        self.debug_error_string: Optional[str] = None
        self.response: Optional[bytes] = None


class SyncAttempt:
    """A sync attempt made on grpcio's Cython call: its `_state` reads as a grpcio call's state does, and it is the
    grpc.Call the application gets of a call it won (ended by then)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = AttemptState()

    def done(self) -> bool:
        return self._state.code is not None

    def initial_metadata(self) -> Metadata:
        return self._state.initial_metadata or ()

    def trailing_metadata(self) -> Metadata:
        return self._state.trailing_metadata

    def code(self) -> Optional[grpc.StatusCode]:
        return self._state.code

    def details(self) -> Optional[str]:
        return self._state.details

    def debug_error_string(self) -> Optional[str]:
        return self._state.debug_error_string


def tell(callback: Callable[[Any], None], attempt: Any) -> None:
    """Nothing may raise on grpcio's spin thread: it would end, and every call of its channel with it."""
    try:
        callback(attempt)
    except Exception:
        logging.getLogger("grpc_retry").exception("grpc_retry: an attempt's callback failed")


def report_end(call: Any, on_end: Callable[[Any], None]) -> Any:
    """grpcio's own sync call as an attempt that reports its end: `on_end(call)` once it has ended (at once if it
    has), from grpcio's thread. The call."""
    if not call.add_callback(partial(on_end, call)):
        on_end(call)
    return call


def end_record(attempt: Any) -> AttemptState:
    """What a sync attempt that reports its end (either transport's) leaves as it ends: its end record."""
    state: AttemptState = attempt._state
    return state


def sync_status(call: Any) -> Tuple[Any, Optional[str], Metadata, Optional[str], Metadata]:
    """An ended sync attempt's (code, details, trailing metadata, debug error string, initial metadata), read
    without blocking: grpcio's accessors each wait for their own field, and a call cancelled locally may never
    get some of them (its debug string, say)."""
    state = call._state
    return (state.code, decode(state.details), tuple(state.trailing_metadata or ()),
            decode(state.debug_error_string), tuple(state.initial_metadata or ()))


def grpcio_exchange(m: Any, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
                    wait_for_ready: Optional[bool], compression: Any, call_wanted: bool) -> Tuple[Any, Any, bool]:
    """A blocking unary-unary exchange as grpcio's own blocking call (`m`: grpcio's multicallable of a subchannel,
    or what stands for it), on this thread: (its call, or the error it raised, or None if it succeeded and no call
    is wanted; its response; whether it succeeded)."""
    try:
        if call_wanted:
            response, call = m.with_call(request, timeout=timeout, metadata=metadata, credentials=credentials,
                                         wait_for_ready=wait_for_ready, compression=compression)
            return call, response, True
        return None, m(request, timeout=timeout, metadata=metadata, credentials=credentials,
                       wait_for_ready=wait_for_ready, compression=compression), True
    except grpc.RpcError as error:
        return error, None, False


def sync_code(call: Any) -> Any:
    """An ended sync attempt's status code (a grpc.StatusCode), without blocking."""
    return call._state.code


def sync_response(call: Any) -> Any:
    """The response of a sync unary attempt that ended OK."""
    return call._state.response


def decode(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    text: Optional[str] = value  # (not typing.cast: compiled, that stays a call of a Python function)
    return text


# -- asyncio attempts -------------------------------------------------------------------------------------------

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class AioAttemptBase:
    """What either transport's asyncio attempt keeps and answers alike (each is a subclass): its status and headers
    as its call tells them (the accessors below read them), the tasks awaiting them, its done callbacks, and what
    grpc.aio's channel asks of its calls. How a call tells them, and how it is cancelled (`_cancelled()`), is each
    transport's own."""

    __slots__ = ("_call", "_loop", "_status", "_initial_metadata", "_locally_cancelled", "_request_stream", "_waiters",
                 "_callbacks", "sent", "on_headers", "on_end", "on_sent", "on_written",
                 "__weakref__")  # grpc.aio's channel tracks its calls in a WeakSet

    def __init__(self, call: Any, loop: asyncio.AbstractEventLoop, request_stream: bool) -> None:
        self._call = call
        self._loop = loop
        self._status: Any = None  # code() (C-core's number), details(), trailing_metadata(), debug_error_string()
        self._initial_metadata: Optional[Metadata] = None
        self._locally_cancelled = False
        self._request_stream = request_stream
        self._waiters: Optional[List[asyncio.Future[None]]] = None  # awaiting the headers, the metadata sent, the end
        self._callbacks: Optional[List[Callable[[Any], None]]] = None
        self.sent = False  # a request stream's metadata went out
        self.on_headers: Optional[Callable[[], None]] = None
        self.on_end: Optional[Callable[[Any], None]] = None
        self.on_sent: Optional[Callable[[], None]] = None
        self.on_written: Optional[Callable[[], None]] = None

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, None
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _set_headers(self, metadata: Metadata) -> None:
        if self._initial_metadata is None:
            self._initial_metadata = metadata
            self._wake()

    def _set_status(self, status: Any) -> None:
        self._status = status
        self._set_headers(())
        self._wake()

    def _tell_sent(self) -> None:
        """A request stream's metadata went out: tell the driver `on_sent()`."""
        self.sent = True
        self._wake()
        if self.on_sent is not None:
            self.on_sent()

    def _tell_end(self, response: Any) -> None:
        """Tell the driver `on_end(response)`, then the done callbacks: its status is set."""
        on_end = self.on_end
        # They hold the attempt: no cycle outlives it (nor its grpcio call).
        self.on_headers = self.on_end = self.on_sent = self.on_written = None
        if on_end is not None:
            on_end(response)
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for callback in callbacks:
                callback(self)

    def _cancelled(self) -> None:
        """Cancel its grpcio call, set its status and end (`_tell_end(EOF)`): the transport's own."""
        raise NotImplementedError

    async def _woken(self) -> None:
        waiter = self._loop.create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        await waiter

    async def initial_metadata(self) -> Metadata:
        while self._initial_metadata is None:
            await self._woken()
        return self._initial_metadata

    async def wait_for_connection(self) -> None:
        """As grpc.aio's: a request stream's until its metadata went out, a unary request's (as its unary-stream
        call) until its headers came; or until it ended."""
        if self._request_stream:
            while not self.sent and self._status is None:
                await self._woken()
        else:
            await self.initial_metadata()

    async def code(self) -> grpc.StatusCode:
        while self._status is None:
            await self._woken()
        return _CODES[self._status.code()]

    def done(self) -> bool:
        return self._status is not None

    def is_locally_cancelled(self) -> bool:
        return self._locally_cancelled

    def cancel(self) -> bool:
        """Cancel the attempt: it ends now (`on_end(EOF)` and the done callbacks run before this returns)."""
        if self._status is not None:
            return False
        self._locally_cancelled = True
        self._cancelled()
        return True

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:  # grpc.aio's channel, tracking it
        if self._status is not None:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)


def aio_status(attempt: Any) -> Optional[Any]:
    """An ended attempt's status (code(), details(), trailing_metadata(), debug_error_string()), or None."""
    return attempt._status


def aio_initial_metadata(attempt: Any) -> Tuple[Tuple[str, Any], ...]:
    metadata: Tuple[Tuple[str, Any], ...] = attempt._initial_metadata or ()
    return metadata


def aio_headers_came(attempt: Any) -> bool:
    """Whether an asyncio attempt's response headers have come and its end has not (real headers, then, not a
    Trailers-Only response's), whether or not what waits on them has run yet."""
    came: bool = attempt._initial_metadata is not None and attempt._status is None
    return came


def aio_locally_cancelled(attempt: Any) -> bool:
    cancelled: bool = attempt._locally_cancelled
    return cancelled


class _Dispatch:
    """A `_Batch`'s completion being handed on from grpcio (its loop, None between), and the tasks that calls it
    ended woke meanwhile (`EndWaiter`): they run as soon as it has been handled, on the same loop turn. (grpcio
    reads its completion queue on one loop's thread: one completion is handed on at a time.)"""

    __slots__ = ("loop", "woken")

    def __init__(self) -> None:
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.woken: List[EndWaiter] = []

    def wake(self, loop: asyncio.AbstractEventLoop) -> None:
        woken, self.woken = self.woken, []
        i, n = 0, len(woken)
        try:
            if _current_task(loop) is None:  # (else handed on inside a task, not grpcio's own way)
                while i < n:
                    waiter = woken[i]
                    i += 1
                    waiter._run()
        finally:  # the rest (all, inside a task; after a SystemExit or KeyboardInterrupt) a loop turn later
            while i < n:
                waiter = woken[i]
                i += 1
                waiter._run_soon()


_DISPATCH = _Dispatch()
DISPATCH = _DISPATCH  # (the same, by a name other modules import)
_WAITING, _ENDED, _CANCELLED = 0, 1, 2  # an EndWaiter's states


class EndWaiter:
    """What a task awaiting an asyncio call's end waits on, in place of an asyncio future: the end wakes the task
    at once when a batch's completion ended the call (`_Batch`), as soon as that completion has been handled (its
    done callbacks run), where a future would have the loop run the task's wakeup a loop turn later (a handle and
    a turn per call). Otherwise (a cancel, a timer, a read) as a future: through the loop, a turn later. It is what
    asyncio's Task asks of a future it awaits (`_asyncio_future_blocking`, as asyncio.isfuture() reads it)."""

    __slots__ = ("_loop", "_state", "_callbacks", "_cancel_message", "_asyncio_future_blocking")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._state = _WAITING
        self._callbacks: Optional[List[Tuple[Callable[[Any], Any], contextvars.Context]]] = None
        self._cancel_message: Any = None
        self._asyncio_future_blocking = False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._state != _WAITING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> None:
        if self._state == _CANCELLED:
            raise asyncio.CancelledError() if self._cancel_message is None else asyncio.CancelledError(
                self._cancel_message)
        if self._state == _WAITING:
            raise asyncio.InvalidStateError("Result is not ready.")
        return None

    def exception(self) -> Optional[BaseException]:
        self.result()
        return None

    def add_done_callback(self, fn: Callable[[Any], Any], *, context: Optional[contextvars.Context] = None) -> None:
        if context is None:
            context = contextvars.copy_context()
        if self._state != _WAITING:
            self._loop.call_soon(fn, self, context=context)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append((fn, context))

    def remove_done_callback(self, fn: Callable[[Any], Any]) -> int:
        callbacks = self._callbacks
        if not callbacks:
            return 0
        kept = [(f, c) for f, c in callbacks if f != fn]
        self._callbacks = kept
        return len(callbacks) - len(kept)

    def set_result(self, _: Any) -> None:
        if self._state != _WAITING:
            raise asyncio.InvalidStateError("invalid state")
        self._state = _ENDED
        if self._callbacks is not None:
            if _DISPATCH.loop is self._loop:
                _DISPATCH.woken.append(self)
            else:
                self._run_soon()

    def cancel(self, msg: Any = None) -> bool:
        if self._state != _WAITING:
            return False
        self._state = _CANCELLED
        self._cancel_message = msg
        self._run_soon()
        return True

    def _run_soon(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn, context in callbacks:
                self._loop.call_soon(fn, self, context=context)

    def _run(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn, context in callbacks:  # (as the loop runs a handle)
                try:
                    context.run(fn, self)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as error:
                    self._loop.call_exception_handler({"message": "grpc_retry: a call's waiter failed",
                                                       "exception": error})

    def __await__(self) -> Any:
        if self._state == _WAITING:
            self._asyncio_future_blocking = True
            yield self
        if self._state == _WAITING:
            raise RuntimeError("await wasn't used with future")
        return self.result()

    def __iter__(self) -> Any:
        return self.__await__()
