"""The direct transport (grpc_retry/_transport): every use of grpcio's private internals, in one place: what the
drivers need to know of an attempt without blocking or waiting for a coroutine, and which grpcio's public API does
not tell.

asyncio: grpc.aio runs a call's done callbacks inside the coroutine that sets its status, before a unary response
is returned; so a unary attempt's end is watched on its invocation task, and its status read from the Cython
call. Sync: a done callback runs on grpcio's own thread, where `initial_metadata()` can block that thread for
good (the headers it waits for are delivered by that very thread); so the driver peeks at the call's state.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
import re
import threading
import time
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Tuple, cast

import grpc
from grpc import aio
from grpc._cython import cygrpc

from grpc_retry._waiters import Waiters

Metadata = Tuple[Any, ...]  # (key, value) pairs


def _private(root: Any, path: str) -> Any:
    """A private name of grpcio's, or None where the installed grpcio lacks it. The module imports on any grpcio
    (the drivers import its transport-neutral parts); the direct transport serves only where grpc_retry/_transport
    /check.py found every name it uses."""
    try:
        for part in path.split("."):
            root = getattr(root, part)
    except AttributeError:
        return None
    return root


try:
    from grpc import _channel, _compression, _observability
    from grpc.aio import _interceptor
except ImportError:
    _channel = _compression = _observability = _interceptor = None  # type: ignore[assignment]

# The names a call uses, bound once: each read of a module's attribute is a lookup.
EOF = grpc.aio.EOF
AioRpcStatus = _private(cygrpc, "AioRpcStatus")
ExecuteBatchError = _private(cygrpc, "ExecuteBatchError")
ReceiveInitialMetadataOperation = _private(cygrpc, "ReceiveInitialMetadataOperation")
ReceiveMessageOperation = _private(cygrpc, "ReceiveMessageOperation")
ReceiveStatusOnClientOperation = _private(cygrpc, "ReceiveStatusOnClientOperation")
SendCloseFromClientOperation = _private(cygrpc, "SendCloseFromClientOperation")
SendInitialMetadataOperation = _private(cygrpc, "SendInitialMetadataOperation")
SendMessageOperation = _private(cygrpc, "SendMessageOperation")
build_census_context = _private(cygrpc, "build_census_context")
execute_batch = _private(cygrpc, "execute_batch")
_get_running_loop = asyncio._get_running_loop
_current_task = asyncio.current_task

# -- asyncio ---------------------------------------------------------------------------------------------------


def aio_working_loop() -> asyncio.AbstractEventLoop:
    """The loop a grpc.aio channel made now binds to: the running one, or (outside a coroutine) grpc.aio's pick."""
    return cast(asyncio.AbstractEventLoop, cygrpc.get_working_loop())


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


# Every asyncio attempt is made on grpc.aio's Cython call directly: no grpc.aio call object, no task and no future,
# only the batches, each told its completion by grpcio's completion queue (`_Batch`). grpc.aio's own calls add a
# Python call object, tasks that run their batches one after another, and a loop turn before the first starts.
# - A unary-unary attempt, unhedged, is one batch, as grpc.aio's.
# - Hedged, it must show its response headers before its response (they commit the call), where grpc.aio's unary
#   call gets both at once and its unary-stream call costs ~1.6x the CPU (four batches, and tasks to drive them):
#   two batches in flight together, the request with the headers and the response with the status.
# - A response stream is read a batch per message, as the reader asks.
# - A request stream sends its metadata in a batch of its own (the call's writes wait for it, as grpc.aio's), then a
#   batch per message and one to half-close, one at a time as the machine hands them out. Its response batch is in
#   flight from the start: the deadline, or a server that ends the call early, reaches the driver at once, where
#   grpc.aio's stream-unary call asks for its status only once the response headers came.

_NO_FLAGS = 0
_WAIT_FOR_READY = {None: 0, False: _private(cygrpc, "InitialMetadataFlags.wait_for_ready_explicitly_set") or 0,
                   True: (_private(cygrpc, "InitialMetadataFlags.wait_for_ready_explicitly_set") or 0)
                   | (_private(cygrpc, "InitialMetadataFlags.wait_for_ready") or 0)}
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_LOCALLY_CANCELLED = "Locally cancelled by application!"  # grpc.aio's words, as its own calls' cancel()
_CORE_ERROR = "Internal error from Core"
_OK = grpc.StatusCode.OK

def _unary_ops(request: bytes, metadata: Any, flags: int) -> Tuple[Tuple[Any, ...], Tuple[Any, Any, Any]]:
    """A unary-unary exchange's operations: (what sends the request and half-closes, (what receives the headers,
    the message, the status))."""
    sending = (SendInitialMetadataOperation(metadata, flags), SendMessageOperation(request, _NO_FLAGS),
               SendCloseFromClientOperation(_NO_FLAGS))
    return sending, (ReceiveInitialMetadataOperation(_NO_FLAGS), ReceiveMessageOperation(_NO_FLAGS),
                     ReceiveStatusOnClientOperation(_NO_FLAGS))


_PENDING, _COMPLETED, _FINISHED, _ABANDONED = 0, 1, 2, 3  # a batch's states
_DONE = object()  # the coroutine of a finished batch


class _Batch:
    """A batch started now on a grpc.aio Cython call, with no task and no asyncio future: grpcio's `execute_batch`
    coroutine, run up to its one wait, waits on this object, which it also takes for its loop. grpcio's completion
    queue hands a batch's completion to any loop but its own through `call_soon_threadsafe`, which this runs at once
    on the loop's thread. `direct`: it then tells `done` at once, where a future would have the loop run its done
    callbacks a turn later (a future, a handle and a loop turn per batch). Else it tells it a turn later, as a
    future: after the completions C-core gave with it (a response stream's reads, grpc.aio's own, which must come
    before its end). Once told, `finish()` runs
    the rest of the coroutine, which reads what the batch received into its operations."""

    __slots__ = ("_coroutine", "_loop", "_direct", "_state", "_error", "done")

    def __init__(self, call: Any, operations: Tuple[Any, ...], loop: asyncio.AbstractEventLoop,
                 direct: bool) -> None:
        self._loop = loop
        self._direct = direct
        self._state = _PENDING
        self._error: Optional[BaseException] = None
        self.done: Optional[Callable[[], None]] = None  # told once the batch completed (set later, maybe)
        self._coroutine: Any = None  # (not Optional: a cast() would be a Python call)
        coroutine = execute_batch(call, operations, self)
        coroutine.send(None)  # up to its wait (it raises ExecuteBatchError if C-core refused the batch)
        self._coroutine = coroutine

    def completed(self) -> bool:
        return self._state == _COMPLETED

    def finish(self) -> bool:
        """Finish the completed batch: False if it failed (the call's status then says how)."""
        self._state = _FINISHED
        coroutine, self._coroutine = self._coroutine, _DONE
        try:
            coroutine.send(None)
        except StopIteration:
            return True
        except ExecuteBatchError:
            return False
        raise RuntimeError("grpcio's execute_batch waited more than once")

    def abandon(self) -> None:
        """Stop waiting for it (its call was cancelled): C-core completes it later, maybe once the loop is closed,
        into nothing, as grpc.aio's batch once its task is cancelled."""
        self.done = None
        if self._state != _FINISHED:
            self._state = _ABANDONED
            self._coroutine.close()

    def _tell(self) -> None:
        done, self.done = self.done, None  # it holds the attempt, which holds this
        if done is not None:
            try:
                done()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as error:  # as the loop does with a done callback that raised
                self._loop.call_exception_handler({"message": "grpc_retry: an attempt's batch callback failed",
                                                   "exception": error})

    # What execute_batch asks of its loop ...

    def create_future(self) -> _Batch:
        return self

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if _get_running_loop() is loop:
            outer, _DISPATCH.loop = _DISPATCH.loop, loop
            try:
                callback(*args)
            finally:
                _DISPATCH.loop = outer
                if outer is None and _DISPATCH.woken:
                    _DISPATCH.wake(loop)
        elif loop.is_closed():
            # Its loop closed before C-core completed it (a call cancelled as its channel closed, say): no one waits
            # for it, and grpcio then reads completions under another loop, which must not see the closed one's
            # error. Run as abandoned, the callback only releases what grpcio holds for the batch.
            self.done = None
            self._state = _ABANDONED
            callback(*args)
        else:
            self._loop.call_soon_threadsafe(callback, *args)

    # ... and of its future.

    def cancelled(self) -> bool:
        return self._state == _ABANDONED

    def set_result(self, _: Any) -> None:
        self._state = _COMPLETED
        if self._direct:
            self._tell()
        else:
            self._loop.call_soon(self._tell)

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self.set_result(None)

    def __await__(self) -> _Batch:
        return self

    def __iter__(self) -> _Batch:
        return self

    def __next__(self) -> _Batch:
        if self._coroutine is None:  # the wait, in __init__ (`finish` then ends it)
            return self
        error, self._error = self._error, None
        if error is not None:
            raise error
        raise StopIteration


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


class AioMethod:
    """A method on one subchannel: made from grpc.aio's multicallable of it, it makes `AioAttempt`s, called as that
    multicallable is (with bytes, or None for a request stream). `headers_first`: they show their response headers
    before the response (a response stream's always do); `stream`: a response stream."""

    __slots__ = ("_multicallable", "_handle", "_headers_first", "_stream", "_channel", "_method", "_loop",
                 "_register", "whole")

    def __init__(self, multicallable: Any, headers_first: bool, stream: bool = False) -> None:
        self._multicallable = multicallable  # grpc.aio's multicallable of the method
        handle = getattr(multicallable, "_registered_call_handle", None)  # grpcio 1.71 on
        self._handle = () if handle is None else (handle,)
        self._headers_first = headers_first or stream
        self._stream = stream
        # What each attempt needs of it, read once (they are fixed): its Cython channel, method and loop, and
        # where grpc.aio tracks its calls (1.83 on: its close cancels them), or None.
        self._channel = multicallable._channel
        self._method = multicallable._method
        self._loop = multicallable._loop
        self._register = getattr(getattr(multicallable, "_python_channel", None), "_register_call", None)
        # The method with a unary response as one batch (a hedged call's first attempt: Method.first_whole)
        self.whole = AioMethod(multicallable, False) if headers_first and not stream else self

    def __call__(self, request: Optional[bytes], *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> AioAttempt:
        if compression or not isinstance(metadata, tuple):
            metadata = tuple(self._multicallable._init_metadata(metadata, compression))
        deadline = None if timeout is None else time.time() + timeout
        call = self._channel.call(self._method, deadline, credentials, wait_for_ready, *self._handle)
        attempt = AioAttempt(call, self._loop, request, metadata, _WAIT_FOR_READY[wait_for_ready],
                             self._headers_first, self._stream)
        if self._register is not None:  # tracked as grpc.aio's own calls are
            self._register(attempt)
        return attempt


class AioResponseStream(AioMethod):
    """A method with a response stream on one subchannel, from grpc.aio's multicallable of it."""

    __slots__ = ()

    def __init__(self, multicallable: Any) -> None:
        super().__init__(multicallable, True, True)


class AioAttempt:
    """One attempt. It tells the driver what happens, from the done callbacks of its batches: `on_headers()` when
    the response headers came (headers first only), `on_end(response or EOF)` when it ended; with a request stream,
    `on_sent()` once its metadata went out and `on_written()` once a message written went. With a response stream,
    read() reads its messages; it is then followed by its done callbacks.
    Building its batches may raise (metadata grpcio cannot send): grpc.aio would raise that from the call.
    It keeps its own status and headers (aio_status(), aio_initial_metadata()), and answers what grpc.aio's channel
    asks of its calls: done(), cancel(), code(), add_done_callback()."""

    __slots__ = ("_call", "_loop", "_status", "_initial_metadata", "_locally_cancelled", "_waiters", "_callbacks",
                 "_ops", "_first", "_last", "_end_waits", "_sending", "_writing", "_closing", "_request_stream",
                 "_direct", "sent", "on_headers", "on_end", "on_sent", "on_written",
                 "__weakref__")  # grpc.aio's channel tracks its calls in a WeakSet
    refusal = None  # (refused calls raise as they are made)

    def __init__(self, call: Any, loop: asyncio.AbstractEventLoop, request: Optional[bytes], metadata: Metadata,
                 flags: int, headers_first: bool, stream: bool = False) -> None:
        self._call = call
        self._loop = loop
        self._status: Any = None
        self._initial_metadata: Optional[Metadata] = None
        self._locally_cancelled = False
        self._waiters: Optional[List[asyncio.Future[None]]] = None  # awaiting the headers, the metadata sent, the end
        self._callbacks: Optional[List[Callable[[Any], None]]] = None
        self.on_headers: Optional[Callable[[], None]] = None
        self.on_end: Optional[Callable[[Any], None]] = None
        self.on_sent: Optional[Callable[[], None]] = None
        self.on_written: Optional[Callable[[], None]] = None
        self._end_waits: Optional[bool] = None  # a response stream's end, done before its headers were read
        self._request_stream = request is None
        self.sent = False  # a request stream's metadata went out
        self._sending: Optional[_Batch] = None  # a request stream's metadata, going out
        self._writing: Optional[_Batch] = None  # ... a message of it
        self._closing: Optional[_Batch] = None  # ... its half-close (right behind its last message, maybe)
        context = build_census_context()  # grpcio's observability, as its own calls (None without it)
        if context is not None:
            cygrpc.set_instrumentation_context_on_call_aio(call, context)
        sending, receiving = _unary_ops(b"" if request is None else request, metadata, flags)
        headers, message, status = receiving
        if stream:  # its messages are read one batch each, as the reader asks
            message = None
        self._ops: Tuple[Any, ...] = (headers, message, status)  # () once ended
        response = (status,) if message is None else (message, status)
        self._direct = direct = not stream  # (see _Batch)
        if request is None:  # first, for it raises on metadata grpcio cannot send
            self._sending = _Batch(call, sending[:1], loop, direct)
            self._sending.done = self._sent_done
            sending = ()
        # The batch that ends with the status, and (headers first) the one before it
        self._first: Optional[_Batch] = None
        if headers_first:
            # The response's batch now: started only once the headers came, it would end a loop turn later. Both
            # are told as they complete, the headers first (a unary response most often comes with them: the end
            # then follows at once; empty headers are judged by the driver only if silence follows them).
            self._last = _Batch(call, response, loop, direct)
            try:
                self._first = _Batch(call, sending + (headers,), loop, direct)
            except BaseException:
                self._abandon()
                raise
            self._first.done = self._headers_done
        else:
            self._last = _Batch(call, sending + (headers,) + response, loop, direct)
        if stream or not headers_first:
            # A response stream's end is watched from the start: it must come after the reads C-core ended before
            # it (their tasks are woken in that order). A unary response's, headers first, once the headers' batch
            # is read (`_headers_done`): its end is told after the headers anyway, and C-core ends the headers'
            # batch no later than the call.
            self._last.done = self._end_done

    def _sent_done(self) -> None:
        sending, self._sending = self._sending, None
        if sending is None:
            return  # cancelled meanwhile: it ended then
        if sending.finish() and self._status is None:  # else it failed: the end says how
            self.sent = True
            self._wake()
            if self.on_sent is not None:
                self.on_sent()

    def write(self, data: bytes) -> None:
        """Send a message of the request stream: `on_written()` once it went (one that fails is not told: the
        attempt's end is). One message at a time."""
        self._writing = self._send(SendMessageOperation(data, _NO_FLAGS), self._written)

    def half_close(self) -> None:
        """Half-close the request stream, after the messages written (even the one still going out)."""
        self._closing = self._send(SendCloseFromClientOperation(_NO_FLAGS), self._closed)

    def _send(self, operation: Any, done: Callable[[], None]) -> Optional[_Batch]:
        if self._status is not None:
            return None  # ended: the driver hears (or heard) how
        try:
            batch = _Batch(self._call, (operation,), self._loop, self._direct)
        except ExecuteBatchError:
            return None  # C-core refused it: the call is over, and its status says how
        batch.done = done
        return batch

    def _written(self) -> None:
        writing, self._writing = self._writing, None
        if writing is not None and writing.finish() and self.on_written is not None:
            self.on_written()  # (None: cancelled meanwhile, it ended then)

    def _closed(self) -> None:
        closing, self._closing = self._closing, None
        if closing is not None:
            closing.finish()  # (one that failed: the attempt's end says how)

    def _headers_done(self) -> None:
        first, self._first = self._first, None
        if first is None:
            return  # cancelled meanwhile: it ended then
        end = self._last
        try:
            if first.finish() and self._status is None:  # else it failed before its headers: the end says how
                self._set_headers(self._ops[0].initial_metadata())
                # Empty headers with the end already here need no telling: the end tells all.
                if self.on_headers is not None and (self._initial_metadata or not end.completed()):
                    self.on_headers()
        finally:
            if self._ops:  # (else cancelled meanwhile, by on_headers' commit say: it ended then)
                if self._end_waits is not None:  # a response stream's end came first, and waited for the headers
                    self._end(self._end_waits)
                elif self._ops[1] is not None:  # a unary response: its end is watched from now on
                    if end.completed():
                        self._end_done()
                    else:
                        end.done = self._end_done

    def _end_done(self) -> None:
        if not self._ops:
            return  # cancelled meanwhile: it ended then
        finished = self._last.finish()
        if self._first is not None:  # a response stream's headers' batch is done too, but not yet read
            self._end_waits = finished
        else:
            self._end(finished)

    def _end(self, finished: bool) -> None:
        response = EOF
        if self._status is None:  # not cancelled meanwhile
            headers, message, status = self._ops
            if not finished:
                self._set_status(AioRpcStatus(13, _CORE_ERROR, (), None))
            else:
                self._set_headers(headers.initial_metadata())
                code = status.code()
                if code not in _STATUS_CODES:  # a code gRPC does not define: UNKNOWN, as newer grpcio reads it
                    code = 2
                self._set_status(AioRpcStatus(code, status.details(), status.trailing_metadata(),
                                                     status.error_string()))
                if code == 0 and message is not None:
                    received = message.message()
                    if received is not None:
                        response = received
        self._ops = ()
        # Ended, it needs its C-core call no more: an ended call the application keeps must not keep the grpc.aio
        # channel open in C-core after its close (its subchannel's state watch ends only then).
        self._call = None
        on_end = self.on_end
        # They hold the attempt: no cycle outlives it (nor its C-core call).
        self.on_headers = self.on_end = self.on_sent = self.on_written = None
        if on_end is not None:
            on_end(response)
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for callback in callbacks:
                callback(self)

    def _abandon(self) -> None:
        """Stop waiting for the batches of a cancelled call."""
        for batch in (self._first, self._last, self._sending, self._writing, self._closing):
            if batch is not None:
                batch.abandon()
        self._first = self._sending = self._writing = self._closing = None

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

    def read(self) -> Optional[Awaitable[Any]]:
        """A response stream's next message: grpcio's own read, to await (it gives EOF once the stream ended), or
        None when the status is in already (as grpc.aio's read: no message after it). Not a coroutine of its own:
        a read per message, and its frame would be one more for each."""
        if self._status is not None:
            return None
        return self._call.receive_serialized_message()  # type: ignore[no-any-return]

    async def code(self) -> Any:
        if self._ops:  # not ended: its end sets the status, then calls back
            ended: asyncio.Future[None] = self._loop.create_future()
            self.add_done_callback(lambda _: None if ended.done() else ended.set_result(None))
            await ended
        return _STATUS_CODES[self._status.code()]

    def done(self) -> bool:
        return self._status is not None

    def is_locally_cancelled(self) -> bool:
        return self._locally_cancelled

    def cancel(self) -> bool:
        """Cancel the attempt: it ends now (`on_end(EOF)` and the done callbacks run before this returns)."""
        if self._status is not None:
            return False
        self._locally_cancelled = True
        self._call.cancel(_LOCALLY_CANCELLED)
        self._set_status(AioRpcStatus(1, _LOCALLY_CANCELLED, None, None))
        if self._ops:
            self._abandon()
            self._end(False)
        return True

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:  # grpc.aio's channel, tracking it
        if not self._ops:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)


# grpc.aio's interceptor calls (their cancel, done callbacks and response wrapping are what users of interceptors
# see) with a grpc_retry call at the bottom of the chain. The chain itself is run here: grpcio runs it in a
# method in some releases and in a closure in others, so neither can be overridden across the range.


def _unary_response(self: Any, result: Any) -> Any:
    return result if isinstance(result, aio.UnaryUnaryCall) else _interceptor.UnaryUnaryCallResponse(result)


def _stream_response(call_class: type, iterator_class: type) -> Callable[[Any, Any], Any]:
    def wrap(self: Any, result: Any) -> Any:
        if not isinstance(result, call_class):  # an interceptor that returned an iterator of responses
            result = iterator_class(self._last_returned_call_from_interceptors, result)
        self._last_returned_call_from_interceptors = result
        return result
    return wrap


def _intercepted_kinds() -> Dict[str, Tuple[type, str, Callable[[Any, Any], Any]]]:
    return {
        "unary_unary": (_interceptor.InterceptedUnaryUnaryCall, "intercept_unary_unary", _unary_response),
        "unary_stream": (_interceptor.InterceptedUnaryStreamCall, "intercept_unary_stream",
                         _stream_response(aio.UnaryStreamCall, _interceptor.UnaryStreamCallResponseIterator)),
        "stream_unary": (_interceptor.InterceptedStreamUnaryCall, "intercept_stream_unary",
                         lambda self, result: result),
        "stream_stream": (_interceptor.InterceptedStreamStreamCall, "intercept_stream_stream",
                          _stream_response(aio.StreamStreamCall, _interceptor.StreamStreamCallResponseIterator)),
    }


def aio_intercepted(kind: str) -> type:
    """grpc.aio's intercepted call class for `kind`, made as `cls(multicallable, request, timeout, metadata,
    credentials, wait_for_ready, compression)`; the multicallable's `_make` makes the call at the bottom."""
    base, intercept, wrap = _intercepted_kinds()[kind]

    class Intercepted(base):  # type: ignore[misc, valid-type]
        def __init__(self, multicallable: Any, request: Any, timeout: Optional[float], metadata: Any, credentials: Any,
                     wait_for_ready: Optional[bool], compression: Any) -> None:
            self._retry_multicallable = multicallable
            self._retry_compression = compression
            if not isinstance(metadata, aio.Metadata):  # interceptors get a grpc.aio.Metadata, as from grpc.aio
                metadata = aio.Metadata.from_tuple(tuple(metadata or ()))
            self._last_returned_call_from_interceptors = None
            method = multicallable._method  # interceptors see it as bytes, as grpc.aio gives it
            super().__init__(multicallable._interceptors, request, timeout, metadata, credentials, wait_for_ready,
                             None, method if isinstance(method, bytes) else method.encode(), None, None,
                             asyncio.get_running_loop())

        async def _invoke(self, interceptors: Any, method: Any, timeout: Optional[float], metadata: Any,
                          credentials: Any, wait_for_ready: Optional[bool], request: Any, *serializers: Any) -> Any:
            async def run(index: int, details: Any, request: Any) -> Any:
                if index < len(interceptors):
                    result = await getattr(interceptors[index], intercept)(functools.partial(run, index + 1),
                                                                          details, request)
                    return wrap(self, result)
                call = self._retry_multicallable._make(request, details.timeout, details.metadata,
                                                       details.credentials, details.wait_for_ready,
                                                       self._retry_compression)
                self._last_returned_call_from_interceptors = call
                return call

            details = aio.ClientCallDetails(method, timeout, metadata, credentials, wait_for_ready)
            return await run(0, details, request)

        def time_remaining(self) -> Optional[float]:
            return None

    Intercepted.__name__ = Intercepted.__qualname__ = base.__name__
    return Intercepted


# -- sync ------------------------------------------------------------------------------------------------------


# A hedged sync unary attempt must show its response headers before its response, as the asyncio one: grpcio's
# unary-stream shape, with a worker thread blocked on each hedge until it answered, cost ~3x a unary call's CPU.
# This one is two batches (the request with the headers, the response with the status) on a call grpcio's channel
# manages: its spin thread, which ends grpcio's own futures, hands each batch's event to the attempt.

_PROPAGATE_DEFAULTS = _private(cygrpc, "PropagationConstants.GRPC_PROPAGATE_DEFAULTS")


def sync_direct() -> bool:
    """Whether sync attempts may skip grpcio's Python call layer: not while grpcio's observability plugin (which
    records each of grpcio's own calls from that layer) is registered."""
    return _observability._OBSERVABILITY_PLUGIN is None


class SyncEnded:
    """A sync attempt that has ended, made without a grpcio call object: its `_state` reads as one's would."""

    __slots__ = ("_state",)

    def __init__(self, state: _AttemptState) -> None:
        self._state = state


def sync_unary_start(m: Any, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
                     wait_for_ready: Optional[bool], compression: Any) -> Tuple[Any, Tuple[Any, Any, Any]]:
    """A blocking unary-unary exchange on grpcio's sync multicallable `m` of a subchannel, started on its Cython
    call as grpcio's blocking call starts it (one batch), without the call state, event handling and rendezvous
    that grpcio's adds: the call and its receiving operations, for sync_unary_end(). Raises what grpcio raises for
    a call it cannot start."""
    sending, receiving = _unary_ops(request, _augmented(metadata, compression),
                                    _WAIT_FOR_READY[wait_for_ready])
    deadline = _determined(None if timeout is None else time.time() + timeout)
    call = m._channel.segregated_call(_PROPAGATE_DEFAULTS, m._method, None, deadline, metadata,
                                      None if credentials is None else credentials._credentials,
                                      ((sending + receiving, None),), m._context, m._registered_call_handle)
    return call, receiving


def sync_unary_end(call: Any, receiving: Tuple[Any, Any, Any]) -> SyncEnded:
    """A started blocking unary-unary exchange, waited for on this thread as grpcio's blocking call waits."""
    call.next_event()
    headers, message, status = receiving
    state = _AttemptState()
    state.initial_metadata = headers.initial_metadata()
    _read_status(state, status)
    if state.code is _OK:
        state.response = message.message()
    return SyncEnded(state)


_BYTES: Any = None  # grpcio's "serializer" of requests that are bytes already


class SyncBlockingRequestStream:
    """A blocking stream-unary attempt: grpcio's blocking stream-unary call (a call of its own queue, whose events
    run() takes on the caller's thread), made here so that the driver can cancel it from another thread. Its
    requests are sent, one at a time as grpcio sends them, by a worker thread of the channel's (a thread kept
    for the next attempt, where grpcio starts and ends a thread per call: ~a fifth of its CPU a call, one call at
    a time) — or by grpcio's own thread where grpcio's fork support is on (its threads are counted for a fork).
    Its `_state` is grpcio's call state. Raises as it is made what grpcio raises for a call it cannot start."""

    __slots__ = ("_state", "_call", "_requests", "_deadline")

    def __init__(self, m: Any, requests: Iterator[bytes], *, timeout: Optional[float], metadata: Any,
                 credentials: Any, wait_for_ready: Optional[bool], compression: Any) -> None:
        state = self._state = _channel._RPCState(_channel._STREAM_UNARY_INITIAL_DUE, None, None, None, None)
        state.rpc_start_time = time.perf_counter()  # what grpcio's event handling reads, as its own call sets it
        state.method, state.target = _decode(m._method), _decode(m._target)
        augmented = _augmented(metadata, compression)
        self._requests = requests
        self._deadline = None if timeout is None else time.time() + timeout
        self._call = m._channel.segregated_call(
            _PROPAGATE_DEFAULTS, m._method, None, _determined(self._deadline), augmented,
            None if credentials is None else credentials._credentials,
            _channel._stream_unary_invocation_operations_and_tags(augmented, _WAIT_FOR_READY[wait_for_ready]),
            m._context, m._registered_call_handle)

    def run(self, workers: Any) -> grpc.Call:
        """(The caller's thread.) Until it has ended, as grpcio's blocking call waits; then the call grpcio's
        with_call() would give (its state is the attempt's). `workers`: where its requests are sent from."""
        state, call = self._state, self._call
        _send_from(workers, self._requests, state, call, None)
        while True:
            event = call.next_event()
            with state.condition:
                _channel._handle_event(event, state, None)
                state.condition.notify_all()
                if not state.due:
                    return cast(grpc.Call, _channel._MultiThreadedRendezvous(state, call, None, self._deadline))

    def cancel(self) -> bool:
        with self._state.condition:
            if self._state.code is not None:
                return False
        self._call.cancel(cygrpc.StatusCode.cancelled, _LOCALLY_CANCELLED)  # its batches end: run() returns
        return True


def sync_request_stream(m: Any, requests: Iterator[bytes], workers: Any, response_stream: bool, *,
                        timeout: Optional[float], metadata: Any, credentials: Any, wait_for_ready: Optional[bool],
                        compression: Any) -> grpc.Call:
    """A non-blocking attempt with a request stream: grpcio's own call, as its stream-stream `__call__` or its
    stream-unary `future()` makes it (its call object, its events taken by the channel's spin thread), with its
    requests sent from a worker thread of grpc_retry's channel (see SyncBlockingRequestStream) instead of a thread
    grpcio starts and ends for each call."""
    deadline = None if timeout is None else time.time() + timeout
    augmented = _augmented(metadata, compression)
    flags = _WAIT_FOR_READY[wait_for_ready]
    if response_stream:
        state = _channel._RPCState(_channel._STREAM_STREAM_INITIAL_DUE, None, None, None, None)
        operations: Any = ((SendInitialMetadataOperation(augmented, flags),
                            ReceiveStatusOnClientOperation(_NO_FLAGS)),
                           (ReceiveInitialMetadataOperation(_NO_FLAGS),))
    else:
        state = _channel._RPCState(_channel._STREAM_UNARY_INITIAL_DUE, None, None, None, None)
        # (grpcio's future() sends the metadata as given, not the compression's augmented one: so does this)
        operations = _channel._stream_unary_invocation_operations(metadata, flags)
    on_event = _channel._event_handler(state, None)
    state.rpc_start_time = time.perf_counter()  # what grpcio's event handling reads, as its own call sets it
    state.method, state.target = _decode(m._method), _decode(m._target)
    call = m._managed_call(_PROPAGATE_DEFAULTS, m._method, None, _determined(deadline), augmented,
                           None if credentials is None else credentials._credentials, operations, on_event,
                           m._context, m._registered_call_handle)
    _send_from(workers, requests, state, call, on_event)
    return cast(grpc.Call, _channel._MultiThreadedRendezvous(state, call, None, deadline))


def _send_from(workers: Any, requests: Iterator[bytes], state: Any, call: Any, tag: Any) -> None:
    """An attempt's requests sent from one of `workers` (grpcio's own thread where its fork support is on: its
    threads are counted for a fork; or where the channel has closed meanwhile: its close ends the attempt)."""
    if not cygrpc.is_fork_support_enabled():
        try:
            # (In a context of its own, as a new thread's: nothing of one call's iterator is seen by the next.)
            workers.submit(contextvars.Context().run, _send_requests, requests, state, call, tag)
            return
        except RuntimeError:  # the workers closed with their channel
            pass
    _channel._consume_request_iterator(requests, state, call, _BYTES, tag)


_SEND_MESSAGE = _private(cygrpc, "OperationType.send_message")
_SEND_CLOSE = _private(cygrpc, "OperationType.send_close_from_client")


def _send_requests(requests: Iterator[bytes], state: Any, call: Any, tag: Any) -> None:
    """(A worker thread.) Each message of an attempt, sent once the one before it has gone (its completion is seen
    by the thread taking the call's events — the blocking call's caller, or the spin thread, through `tag` —
    which wakes this one), then the half-close; until the attempt ends. `requests` does not raise: the driver
    ends the call itself when the application's iterator or serializer fails."""
    condition, due = state.condition, state.due
    for data in requests:
        with condition:
            if state.code is not None or state.cancelled:
                return
            due.add(_SEND_MESSAGE)
            if not call.operate((SendMessageOperation(data, _NO_FLAGS),), tag):
                due.discard(_SEND_MESSAGE)  # the call is over
                return
            while _SEND_MESSAGE in due and state.code is None:
                condition.wait(0.1)
            if state.code is not None:
                return
    with condition:
        if state.code is None and not state.cancelled:
            due.add(_SEND_CLOSE)
            if not call.operate((SendCloseFromClientOperation(_NO_FLAGS),), tag):
                due.discard(_SEND_CLOSE)


def _read_status(state: _AttemptState, status: Any) -> None:
    """A sync attempt's status, from its received status operation, into its state, as grpcio reads one."""
    code = _STATUS_CODES.get(status.code())
    if code is None:  # a code grpcio does not know: UNKNOWN, in grpcio's words
        state.code, state.details = grpc.StatusCode.UNKNOWN, _channel._unknown_code_details(None, status.details())
    else:
        state.code, state.details = code, _decode(status.details())
        state.debug_error_string = _decode(status.error_string())
    state.trailing_metadata = tuple(status.trailing_metadata() or ())


class SyncHeadersFirst:
    """A unary-unary method on one sync subchannel, made from grpcio's multicallable of it: it makes
    `SyncHeadersFirstAttempt`s. `multicallable`: grpcio's, for an attempt made as one blocking call."""

    __slots__ = ("multicallable",)

    def __init__(self, multicallable: Any) -> None:
        self.multicallable = multicallable

    def __call__(self, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_headers: Callable[[Any], None],
                 on_end: Callable[[Any], None], pollable: bool = False) -> SyncHeadersFirstAttempt:
        """`pollable`: a thread of the application's, free to wait, polls the attempt (it is `polled`), however
        many calls overlap: grpcio's spin thread, taking every call's events, would cost each of them grpcio's
        managed-call path (a context manager to start it, a Python loop turn per event) and a hand-off to the
        waiting caller. Each caller taking its own events counted fewer instructions (callgrind, 16 in flight) and
        the same time within the spread."""
        deadline = None if timeout is None else time.time() + timeout
        return self._attempt(request, _determined(deadline) if pollable else deadline, metadata, credentials,
                             wait_for_ready, compression, on_headers, on_end, pollable, False)

    def polled(self, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
               wait_for_ready: Optional[bool], compression: Any, on_headers: Callable[[Any], None],
               on_end: Callable[[Any], None], whole: bool) -> SyncHeadersFirstAttempt:
        """The attempt as called with `pollable` (a blocking hedged call's first), its arguments in order: no
        keywords to gather and parse on each call's path. `whole`: as one batch (Method.first_whole)."""
        return self._attempt(request, _determined(None if timeout is None else time.time() + timeout), metadata,
                             credentials, wait_for_ready, compression, on_headers, on_end, True, whole)

    def _attempt(self, request: bytes, deadline: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_headers: Callable[[Any], None],
                 on_end: Callable[[Any], None], polled: bool, whole: bool) -> SyncHeadersFirstAttempt:
        return SyncHeadersFirstAttempt(
            self.multicallable, request, deadline, metadata, _augmented(metadata, compression),
            _WAIT_FOR_READY[wait_for_ready], None if credentials is None else credentials._credentials, on_headers,
            on_end, polled, whole)


class _AttemptState:
    """What a sync attempt's end leaves, named as grpcio's call state names it (what sync_status() reads)."""

    __slots__ = ("code", "details", "initial_metadata", "trailing_metadata", "debug_error_string", "response")

    def __init__(self) -> None:
        self.code: Optional[grpc.StatusCode] = None
        self.details: Optional[str] = None
        self.initial_metadata: Optional[Metadata] = None
        self.trailing_metadata: Metadata = ()
        self.debug_error_string: Optional[str] = None
        self.response: Optional[bytes] = None


class _SyncAttempt:
    """A sync attempt made on grpcio's Cython call: its `_state` reads as a grpcio call's state does, and it is the
    grpc.Call the application gets of a call it won (ended by then)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = _AttemptState()

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


def _tell(callback: Callable[[Any], None], attempt: Any) -> None:
    """Nothing may raise on grpcio's spin thread: it would end, and every call of its channel with it."""
    try:
        callback(attempt)
    except Exception:
        logging.getLogger("grpc_retry").exception("grpc_retry: an attempt's callback failed")


class _UnaryAttempt(_SyncAttempt):
    """A sync unary-unary attempt on grpcio's Cython call: its end read into its state, then told to `on_end(self)`
    (and nothing more to `on_headers`)."""

    __slots__ = ("_call", "_ops", "_lock", "on_headers", "on_end")
    _call: Any  # grpcio's call, made by the subclass once the rest is in place (its events may come at once)

    def _init_unary(self, receiving: Tuple[Any, ...], on_end: Callable[[Any], None]) -> None:
        """What its subclasses' constructors do first, as a C call (super().__init__() would be a Python call)."""
        self._state = _AttemptState()
        self._lock = threading.Lock()
        self._ops: Tuple[Any, ...] = receiving  # () once ended
        self.on_headers: Optional[Callable[[Any], None]] = None
        self.on_end: Optional[Callable[[Any], None]] = on_end

    def _end(self, success: bool) -> None:
        state = self._state
        lock = self._lock
        lock.acquire()  # (not `with`: compiled, each `with` binds two of the lock's methods and makes a tuple)
        try:
            if state.code is None:  # not cancelled meanwhile
                headers, message, status = self._ops
                if state.initial_metadata is None:
                    state.initial_metadata = headers.initial_metadata() if success else ()
                if success:
                    _read_status(state, status)
                    if state.code is _OK:
                        state.response = message.message()
                else:
                    state.code, state.details = grpc.StatusCode.INTERNAL, _CORE_ERROR
            self._ops = ()
            on_end, self.on_headers, self.on_end = self.on_end, None, None
        finally:
            lock.release()
        if on_end is not None:
            _tell(on_end, self)

    def cancel(self) -> bool:
        state = self._state
        with self._lock:
            if state.code is not None:
                return False
            state.code, state.details = grpc.StatusCode.CANCELLED, _LOCALLY_CANCELLED
            if state.initial_metadata is None:
                state.initial_metadata = ()
        self._call.cancel(1, _LOCALLY_CANCELLED)  # its batches end, and it tells
        return True


class SyncUnaryAttempt(_UnaryAttempt):
    """One attempt of a non-blocking, unhedged sync unary-unary call (a future): the one batch grpcio's future()
    starts, on a call its channel manages, without grpcio's call state, event handler and rendezvous around it; it
    calls `on_end(self)` from grpcio's spin thread once it has ended. Raises as it is made what grpcio raises for a
    call it cannot start."""

    __slots__ = ()

    def __init__(self, m: Any, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None]) -> None:
        sending, receiving = _unary_ops(request, _augmented(metadata, compression),
                                        _WAIT_FOR_READY[wait_for_ready])
        self._init_unary(receiving, on_end)
        self._call = m._managed_call(_PROPAGATE_DEFAULTS, m._method, None,
                                     None if timeout is None else time.time() + timeout, metadata,
                                     None if credentials is None else credentials._credentials,
                                     (sending + receiving,), self._on_event, m._context, m._registered_call_handle)

    def _on_event(self, event: Any) -> bool:
        """grpcio's spin thread: the batch is done, and so is the call."""
        self._end(bool(event.success))
        return True


class SyncHeadersFirstAttempt(_UnaryAttempt):
    """One attempt of a hedged sync unary call. It calls `on_headers(self)` when its response headers came
    (unless its end came with them), then `on_end(self)` once it has ended: from grpcio's spin thread (never
    blocking it), or, if `polled`, from the thread that calls poll() — the blocking call's caller, as grpcio's
    blocking call waits on its own call's queue: no spin thread to start per call, no hand-off. `whole` (polled
    only): one batch, as a blocking unary call's, whose headers show with its end (only `on_end` is told)."""

    __slots__ = ("_end_waits", "polled")

    def __init__(self, m: Any, request: bytes, deadline: Optional[float], metadata: Any, augmented: Any, flags: int,
                 credentials: Any, on_headers: Callable[[Any], None], on_end: Callable[[Any], None],
                 polled: bool = False, whole: bool = False) -> None:
        sending, receiving = _unary_ops(request, augmented, flags)
        self._init_unary(receiving, on_end)
        self.polled = polled
        # The end's batch came first: whether it succeeded (one batch: no headers' batch to wait for)
        self._end_waits: Optional[bool] = False if whole else None
        self.on_headers = on_headers
        headers, message, status = receiving
        # The request's batch first: grpcio starts them one after the other, and the request's is the one that
        # can fail to start (metadata C-core refuses), which must leave no batch of this call behind. (Its events
        # may come before this returns: only cancel() uses `_call`.)
        request_batch, response_batch = sending + (headers,), (message, status)
        if whole:
            self._call = m._channel.segregated_call(_PROPAGATE_DEFAULTS, m._method, None, deadline, metadata,
                                                    credentials, ((sending + receiving, None),), m._context,
                                                    m._registered_call_handle)
        elif polled:
            self._call = m._channel.segregated_call(_PROPAGATE_DEFAULTS, m._method, None, deadline, metadata,
                                                    credentials, ((request_batch, None), (response_batch, None)),
                                                    m._context, m._registered_call_handle)
        else:
            self._call = m._managed_call(_PROPAGATE_DEFAULTS, m._method, None, deadline, metadata, credentials,
                                         (request_batch, response_batch), self._on_event, m._context,
                                         m._registered_call_handle)

    def poll(self) -> None:
        """(A polled attempt; one thread, which may block.) Until it has ended, take its events off its call's own
        queue and report them, on this thread. Interrupted (a signal's exception), grpcio has dropped the call:
        the attempt ends CANCELLED, and tells, before the exception goes on."""
        call = self._call
        try:
            while not self._on_event(call.next_event()):
                pass
        except BaseException:
            self.cancel()  # (grpcio's call has no batch left to cancel)
            self._end(False)
            raise

    def _on_event(self, event: Any) -> bool:
        """grpcio's spin thread (or the poller): a batch is done. True once every one is (grpcio then stops counting
        the call)."""
        state = self._state
        lock = self._lock
        if len(event.batch_operations) == 4:  # the request and the headers (one batch: all six, as the end's)
            lock.acquire()
            try:
                told = state.code is None and bool(event.success)  # else cancelled, or failed: the end tells
                if told:
                    state.initial_metadata = self._ops[0].initial_metadata()
                end, self._end_waits = self._end_waits, False
            finally:
                lock.release()
            on_headers = self.on_headers
            if told and on_headers is not None and (state.initial_metadata or end is None):
                _tell(on_headers, self)
            if end is not None:
                self._end(end)
            return end is not None
        lock.acquire()
        try:
            if self._end_waits is None:  # the headers' batch is yet to come: the end waits for it
                self._end_waits = bool(event.success)
                return False
        finally:
            lock.release()
        self._end(bool(event.success))
        return True


# A sync attempt with a response stream (unary request): the batches grpcio's unary-stream call starts, on a call
# its channel manages, without grpcio's response iterator around them (its call state, a closure per event, and a
# timed condition wait per message). Messages are read one batch at a time on the reader's demand, as grpcio
# reads them.


class SyncResponseStream:
    """A unary-stream method on one sync subchannel, made from grpcio's multicallable of it: it makes
    `SyncStreamAttempt`s; grpcio's own calls while its observability plugin is registered (see sync_direct)."""

    __slots__ = ("_multicallable",)

    def __init__(self, multicallable: Any) -> None:
        self._multicallable = multicallable

    def __call__(self, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None]) -> Any:
        m = self._multicallable
        if not sync_direct():
            call = m(request, timeout=timeout, metadata=metadata, credentials=credentials,
                     wait_for_ready=wait_for_ready, compression=compression)
            if not call.add_callback(lambda: on_end(call)):
                on_end(call)
            return call
        return SyncStreamAttempt(
            m, request, _determined(None if timeout is None else time.time() + timeout), metadata,
            _augmented(metadata, compression), _WAIT_FOR_READY[wait_for_ready],
            None if credentials is None else credentials._credentials, on_end)


class SyncStreamAttempt(_SyncAttempt):
    """One attempt with a response stream. `next()` reads its next message (StopIteration once it has ended: its
    status then says how), `wait_headers()` and `wait_end()` block for what they name (never call them on
    grpcio's own thread). It calls `on_end(self)` once it has ended (status and headers in), from grpcio's spin
    thread, or from a thread waiting in next() for that end: the reader then hears it without waiting for
    grpcio's thread to tell it."""

    __slots__ = ("_call", "_lock", "_messages", "_others", "_due", "_reading", "_readers", "_message",
                 "_headers_due", "_status_due", "_status", "on_end")

    def __init__(self, m: Any, request: bytes, deadline: Optional[float], metadata: Any, augmented: Any, flags: int,
                 credentials: Any, on_end: Callable[[Any], None]) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._messages = Waiters(self._lock)  # readers: a message came, or the end
        self._others = Waiters(self._lock)  # waiting for the headers or the end
        self._due = 2  # batches started and not yet done
        self._reading = False  # a message's batch is started
        self._readers = 0  # threads waiting in next()
        self._message: Optional[bytes] = None  # read, not yet taken
        self._headers_due = self._status_due = True
        self.on_end: Optional[Callable[[Any], None]] = on_end
        headers = ReceiveInitialMetadataOperation(_NO_FLAGS)
        self._status = ReceiveStatusOnClientOperation(_NO_FLAGS)
        # As grpcio's: the request's batch (which can fail to start, and then leaves no batch behind) first.
        self._call = m._managed_call(
            _PROPAGATE_DEFAULTS, m._method, None, deadline, metadata, credentials,
            ((SendInitialMetadataOperation(augmented, flags), SendMessageOperation(request, _NO_FLAGS),
              SendCloseFromClientOperation(_NO_FLAGS), self._status), (headers,)),
            self._on_event, m._context, m._registered_call_handle)

    def _on_event(self, event: Any) -> bool:
        """grpcio's spin thread: the request's batch (which ends with the status) or the headers' is done. True
        once no batch of the call is left (grpcio then stops counting it)."""
        state = self._state
        on_end = None
        with self._lock:
            self._due -= 1
            operations = event.batch_operations
            if len(operations) == 1:
                self._headers_due = False
                state.initial_metadata = operations[0].initial_metadata()  # as grpcio's, even once cancelled
            else:
                self._status_due = False
                if state.code is None:
                    _read_status(state, self._status)
                else:  # cancelled meanwhile
                    state.trailing_metadata = tuple(self._status.trailing_metadata() or ())
                self._messages.notify_all()
            # A reader waiting with nothing left to read wakes to this end, and tells it.
            if not (self._readers and self._message is None and not self._reading):
                on_end = self._take_end()
            self._others.notify_all()
            done = self._due == 0
        if on_end is not None:
            _tell(on_end, self)
        return done

    def _take_end(self) -> Optional[Callable[[Any], None]]:
        """(Under the lock.) on_end, once, if the attempt has ended with its headers and status in."""
        if self._headers_due or self._status_due:
            return None
        on_end, self.on_end = self.on_end, None
        return on_end

    def _on_message(self, event: Any) -> bool:
        with self._lock:
            self._due -= 1
            self._reading = False
            self._message = event.batch_operations[0].message()  # None at the stream's end
            self._messages.notify_all()
            return self._due == 0

    def __next__(self) -> bytes:
        state = self._state
        on_end = None
        try:
            with self._lock:
                if state.code is None and not self._reading:  # as grpcio's: once the status is in, no more reads
                    self._due += 1
                    if self._call.operate((ReceiveMessageOperation(_NO_FLAGS),), self._on_message):
                        self._reading = True
                    else:
                        self._due -= 1
                while True:
                    message = self._message
                    if message is not None:
                        self._message = None
                        return message
                    if not self._reading and state.code is not None:
                        if on_end is None:
                            on_end = self._take_end()
                        break
                    self._readers += 1
                    try:
                        self._messages.wait()
                    finally:
                        self._readers -= 1
                        if on_end is None and not self._readers and self._message is None and not self._reading:
                            on_end = self._take_end()  # if it was left to the readers (this one may be interrupted)
        finally:
            if on_end is not None:
                _tell(on_end, self)
        raise StopIteration()

    def wait_headers(self) -> Tuple[Metadata, bool]:
        """As sync_wait_headers."""
        state = self._state
        with self._lock:
            while state.initial_metadata is None and state.code is None:
                self._others.wait()
            return tuple(state.initial_metadata or ()), state.code is not None

    def wait_end(self) -> None:
        state = self._state
        with self._lock:
            while state.code is None:
                self._others.wait()

    def cancel(self) -> bool:
        state = self._state
        with self._lock:
            if state.code is not None:
                return False
            state.code, state.details, state.trailing_metadata = grpc.StatusCode.CANCELLED, _LOCALLY_CANCELLED, ()
            if state.initial_metadata is None:
                state.initial_metadata = ()
            self._messages.notify_all()
            self._others.notify_all()
        self._call.cancel(1, _LOCALLY_CANCELLED)  # its batches end, and it tells
        return True


def sync_status(call: Any) -> Tuple[Any, Optional[str], Metadata, Optional[str], Metadata]:
    """An ended sync attempt's (code, details, trailing metadata, debug error string, initial metadata), read
    without blocking: grpcio's accessors each wait for their own field, and a call cancelled locally may never
    get some of them (its debug string, say)."""
    state = call._state
    return (state.code, _decode(state.details), tuple(state.trailing_metadata or ()),
            _decode(state.debug_error_string), tuple(state.initial_metadata or ()))


def sync_code(call: Any) -> Any:
    """An ended sync attempt's status code (a grpc.StatusCode), without blocking."""
    return call._state.code


def sync_wait_headers(call: Any) -> Tuple[Metadata, bool]:
    """Block (never on grpcio's own thread) until a sync attempt has its response headers or has ended:
    (the headers so far, whether it has ended)."""
    if type(call) is SyncStreamAttempt:
        return call.wait_headers()
    state = call._state
    with state.condition:
        while state.initial_metadata is None and state.code is None:
            state.condition.wait()
        return tuple(state.initial_metadata or ()), state.code is not None


def sync_wait_end(call: Any) -> None:
    if type(call) is SyncStreamAttempt:
        call.wait_end()
        return
    state = call._state
    with state.condition:
        while state.code is None:
            state.condition.wait()


def sync_response(call: Any) -> Any:
    """The response of a sync unary attempt that ended OK."""
    return call._state.response


def sync_set_response(call: Any, response: Any) -> None:
    """A sync attempt that ended OK, whose result() is then `response` (its attempts carry bytes)."""
    call._state.response = response


def new_sync_channel(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                     compression: Optional[grpc.Compression]) -> grpc.Channel:
    """A subchannel: grpcio's own sync channel class, made as grpc.insecure_channel / secure_channel make it —
    never through those constructors, which an instrumentation (or install()) may have replaced."""
    return _channel.Channel(target, tuple(options), _cygrpc_credentials(credentials), compression)


# channelz: which sync subchannel's connection was remade. A channel's channelz id is not told by grpcio: the
# channels made since the last listing are listed, and a subchannel's is the newest one with its target (made
# and listed under one lock, taken for every subchannel grpc_retry makes so; channelz ids grow with creation).
_CHANNELZ_LOCK = threading.Lock()
_channelz_next = 1  # where the next listing starts: every top channel below it was listed before
_SUBCHANNEL_ID = re.compile(rb'"subchannelId":"?([0-9]+)')


def _channelz_after_fork() -> None:
    global _CHANNELZ_LOCK
    _CHANNELZ_LOCK = threading.Lock()  # another thread may have held it as the process forked


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_channelz_after_fork)


def new_sync_channel_with_id(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                             compression: Optional[grpc.Compression]) -> Tuple[grpc.Channel, Optional[int]]:
    """new_sync_channel, and the channel's channelz id (None: not found, as where channelz is off)."""
    global _channelz_next
    with _CHANNELZ_LOCK:
        channel = new_sync_channel(target, options, credentials, compression)
        found = None
        try:
            while True:
                page = json.loads(cygrpc.channelz_get_top_channels(_channelz_next))
                listed = page.get("channel") or ()
                for entry in listed:
                    cid = int(entry["ref"]["channelId"])
                    _channelz_next = max(_channelz_next, cid + 1)
                    if entry.get("data", {}).get("target") == target:
                        found = cid
                if page.get("end", True) or not listed:
                    break
        except (ValueError, KeyError, TypeError):  # not grpcio's channelz as known: no id
            found = None
    return channel, found


def channelz_subchannels(cid: int) -> Optional[Tuple[bytes, ...]]:
    """The channelz ids of the subchannels a sync channel's load balancer holds now (None: the channel is gone).
    Its pick_first makes a new subchannel for each connection it makes after losing one (grpcio 1.70-1.85)."""
    try:
        data = cygrpc.channelz_get_channel(cid)
    except ValueError:
        return None
    return tuple(_SUBCHANNEL_ID.findall(data if isinstance(data, bytes) else data.encode()))


def close_sync_channel(channel: grpc.Channel) -> None:
    channel.close()


def new_aio_channel(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                    compression: Optional[grpc.Compression]) -> grpc.aio.Channel:
    """A subchannel: grpc.aio's own channel class, with no interceptors (see new_sync_channel)."""
    from grpc.aio import _channel

    return cast(grpc.aio.Channel, _channel.Channel(target, tuple(options), _cygrpc_credentials(credentials),
                                                   compression, None))


def _cygrpc_credentials(credentials: Optional[grpc.ChannelCredentials]) -> Any:
    return None if credentials is None else cast(Any, credentials)._credentials


def sync_state_reader(channel: Any) -> Callable[[bool], int]:
    """sync_connectivity(channel, ·) without the indirection, for a poller that reads many channels often."""
    return cast(Callable[[bool], int], channel._channel.check_connectivity_state)


def sync_connectivity(channel: Any, try_to_connect: bool) -> int:
    """A sync grpcio channel's connectivity state (grpc.ChannelConnectivity's number); `try_to_connect` starts a
    connection if it is IDLE. grpcio's public way, subscribe(), starts a poller thread of grpcio's own."""
    return int(channel._channel.check_connectivity_state(try_to_connect))


def sync_calls_in_flight(channel: Any) -> int:
    """How many calls a sync grpcio channel has running (those made as futures and streams, as grpc_retry's
    attempts are): the count grpcio keeps to end its channel's spin thread."""
    return int(channel._call_state.managed_calls)


def sync_watch_connectivity(channel: Any, last: int, timeout: float) -> bool:
    """Block until the channel's state differs from `last` (True) or `timeout` passes (False); raises ValueError
    once the channel is closed. While it blocks, the thread polls grpcio: before grpcio's EventEngine clients
    (1.70 among them) nothing else makes a sync channel's connection attempt progress when no call is running."""
    return bool(channel._channel.watch_connectivity_state(last, time.time() + timeout).success)


def _determined(deadline: Optional[float]) -> Optional[float]:
    """grpcio's _determine_deadline(): the sooner of `deadline` and the deadline of the server handler this thread
    runs (propagated), if any; compiled, where grpcio's is a Python function's call on every call's path."""
    parent: Optional[float] = cygrpc.get_deadline_from_context()
    if parent is None:
        return deadline
    return parent if deadline is None else min(parent, deadline)


def _augmented(metadata: Any, compression: Any) -> Any:
    """grpcio's augment_metadata() (the metadata a call sends, with its compression's), its usual case (neither)
    without a Python function's call."""
    if not metadata and not compression:
        return None
    return _compression.augment_metadata(metadata, compression)


def _decode(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    text: Optional[str] = value  # (not typing.cast: compiled, that stays a call of a Python function)
    return text


# -- the attempt makers (grpc_retry/_transport/__init__.py: shape() and method()) -------------------------------

_RESPONSE_STREAMS = ("unary_stream", "stream_stream")


class SyncAttempts:
    """Sync attempts on grpcio's Cython calls where they pay: a hedged unary-unary call's attempts show their
    headers first (SyncHeadersFirst), a unary-stream call's are read a batch per message (SyncResponseStream);
    the rest are grpcio's own calls, driven by the driver (sync_direct() says which of its paths)."""

    @staticmethod
    def shape(kind: str, hedged: bool) -> Tuple[str, bool, bool, bool]:
        headers_first = hedged and kind == "unary_unary"
        return kind, False, headers_first, headers_first or kind == "unary_stream"

    @staticmethod
    def method(channel: Any, name: str, shape: Tuple[str, bool, bool, bool], owner: Any) -> Any:
        multicallable = getattr(channel, shape[0])(name)
        if shape[2]:
            return SyncHeadersFirst(multicallable)
        if shape[3]:
            return SyncResponseStream(multicallable)
        return multicallable


class AioAttempts:
    """Every asyncio attempt is grpc_retry's own (AioAttempt): a unary response's made by AioMethod (headers first
    when hedged), a response stream's by AioResponseStream."""

    @staticmethod
    def shape(kind: str, hedged: bool) -> Tuple[str, bool, bool, bool]:
        unary_response = kind not in _RESPONSE_STREAMS
        return kind, unary_response, hedged and unary_response, True

    @staticmethod
    def method(channel: Any, name: str, shape: Tuple[str, bool, bool, bool], owner: Any) -> Any:
        multicallable = getattr(channel, shape[0])(name)
        return AioMethod(multicallable, shape[2]) if shape[1] else AioResponseStream(multicallable)


FINAL_WRAPPED = False  # an attempt of this transport is a grpc.Call the application may get as it is


def sync_final(call: Any, response: Any) -> Any:
    """The grpc.Call the application gets of a successful sync attempt whose deserialized result is `response`:
    the attempt itself, its result() then that response (its attempts carry bytes)."""
    call._state.response = response
    return call


SYNC = SyncAttempts()
AIO = AioAttempts()
