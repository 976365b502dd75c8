"""The asyncio driver: grpc.aio call objects whose attempts are plain grpc.aio calls on a subchannel.

Each logical call owns a RetryCall (the compiled core) and runs it. To keep the happy path cheap, nothing
extra is scheduled per call: the attempt is started when the call is created, and whoever awaits the call
(or reads from it) drives the retries inline. A background task is started only when nobody awaits but
somebody must (add_done_callback). Attempts send and receive bytes; the application's serializer runs once
per message, its deserializer once per delivered response.
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic
from typing import Any, AsyncIterator, Callable, List, Optional

import grpc
from grpc._cython import cygrpc
from grpc.aio import AioRpcError, Metadata, _base_call

from grpc_retry._core import NOT_SENT, RETRY, RetryCall, transparent_kind

log = logging.getLogger("grpc_retry")

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"
_CANCELLED_DETAILS = "Locally cancelled by application!"
_DEADLINE_DETAILS = "Deadline Exceeded"
_EOF = grpc.aio.EOF
_INF = float("inf")
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

# What starting an attempt came to (besides "started").
_STARTED, _WAIT, _DEADLINE = 0, 1, 2


def _trailing_with_attempts(trailing: Optional[Metadata], previous: int) -> Metadata:
    pairs = tuple(trailing) if trailing else ()
    return Metadata(*pairs, (PREVIOUS_ATTEMPTS, str(previous)))


class _RetryingCall:
    """State and status plumbing shared by the four cardinalities."""

    __slots__ = (
        "_core", "_state", "_multicallable", "_subchannels", "_metadata", "_credentials", "_wait_for_ready",
        "_compression", "_deserializer", "_attempt", "_done", "_code", "_details", "_initial", "_trailing", "_error",
        "_callbacks", "_driving", "_waiter", "_sleep", "_loop", "_task", "__weakref__",
        "_grpc_wfr", "_since", "_started", "_stale", "_answered",
    )

    def __init__(self, state, multicallable, core: RetryCall, metadata, credentials, wait_for_ready,
                 compression, deserializer):
        self._core = core
        self._state = state
        self._multicallable = multicallable  # the channel's method: inner(index) is its grpcio multicallable
        self._subchannels = multicallable.subchannels
        self._metadata = tuple(metadata) if metadata else ()
        self._credentials = credentials
        self._wait_for_ready = wait_for_ready
        self._grpc_wfr = False if state.options.enable_retries else wait_for_ready
        self._since = self._started = 0
        self._stale = None
        self._answered = False
        self._compression = compression
        self._deserializer = deserializer
        self._attempt = None
        self._done = False
        self._code: Optional[grpc.StatusCode] = None
        self._details = None
        self._initial = None
        self._trailing = None
        self._error: Optional[BaseException] = None
        self._callbacks: Optional[List[Callable]] = None
        self._driving = False
        self._waiter: Optional[asyncio.Future] = None
        self._sleep: Optional[asyncio.Future] = None
        self._loop = asyncio.get_running_loop()
        self._task: Optional[asyncio.Task] = None

    # -- attempts ---------------------------------------------------------------------------------------

    def _next_attempt(self):
        """Pick an address the call has not used (while one can take it) and count the attempt:
        (grpcio multicallable, metadata, timeout), or _WAIT (no address now), or _DEADLINE."""
        core = self._core
        since = self._since = self._subchannels.generation
        index = self._subchannels.pick(core.used)
        if index < 0 or (self._stale == since and (core.used >> index) & 1):
            return _WAIT
        now = monotonic()
        previous = core.begin_attempt(now)
        if previous < 0:
            return _DEADLINE
        core.use_address(index)
        self._started, self._stale, self._answered = since, None, False
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: attempt %d (previous %d) on %s", id(self), core.attempts, previous,
                      self._subchannels.addresses[index])
        metadata = self._metadata if previous == 0 else self._metadata + ((PREVIOUS_ATTEMPTS, str(previous)),)
        deadline = core.deadline
        return self._multicallable.inner(index), metadata, (None if deadline == _INF else deadline - now)

    def _start_attempt(self) -> int:  # overridden: start the next attempt, or say why not
        raise NotImplementedError

    def _first_attempt(self) -> None:
        result = self._start_attempt()
        if result == _DEADLINE:
            self._finish_local(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
        elif result == _WAIT:
            if self._subchannels.resolved and not self._wait_for_ready:
                self._finish_local(_UNAVAILABLE, self._subchannels.unavailable_details())
            else:
                self._ensure_driver()  # nothing to pick yet: a task waits for an address, as grpcio's call would

    async def _begin(self):
        """Start the next attempt, waiting while no address can take it (resolution pending, or every
        subchannel down and the call waits for ready). True: started. False: the call ended (deadline).
        None: no address and the call fails fast; the caller ends it with the failure at hand."""
        subchannels = self._subchannels
        while not self._done:
            result = self._start_attempt()
            if result == _STARTED:
                return True
            if result == _DEADLINE:
                self._finish_local(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
                return False
            if subchannels.resolved and not self._wait_for_ready:
                return None
            deadline = self._core.deadline
            if deadline != _INF and monotonic() >= deadline:
                self._finish_local(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
                return False
            await self._sleep_until(None if deadline == _INF else deadline - monotonic(), subchannels)
        return False

    async def _begin_or_fail(self):
        """_begin(), ending the call UNAVAILABLE when no address can take it."""
        started = await self._begin()
        if started is None:
            self._finish_local(_UNAVAILABLE, self._subchannels.unavailable_details())
        return bool(started)

    async def _transparent(self, code: grpc.StatusCode, details: Optional[str]):
        """If the attempt failed before the server's application saw it, retry it at once, uncounted.
        False: not transparent (an ordinary status). True: retried, or the call ended. None: no address
        could take it and the call fails fast; the caller ends it with this failure."""
        kind = transparent_kind(code.value[0], details)
        if kind < 0:
            return False
        core = self._core
        if kind == NOT_SENT:
            # Never left the client: only worth another go on an address this call has not tried.
            index = self._subchannels.pick(core.used)
            if index < 0 or (core.used >> index) & 1:
                if not self._wait_for_ready:
                    return False
                self._stale = self._started  # retry a used address only after news of it
        if not core.on_transparent(kind, monotonic()):
            self._stale = None
            return False
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: transparent retry after %s: %s", id(self), code, details)
        return await self._begin()

    async def _sleep_until(self, timeout: Optional[float], subchannels=None) -> None:
        """Sleep `timeout` seconds (None: until woken), or until the subchannels change if given.
        cancel() cuts it short (CancelledError)."""
        loop = self._loop
        sleep = self._sleep = loop.create_future()
        handle = None if timeout is None else loop.call_later(timeout, _wake, sleep)
        listener = None
        if subchannels is not None:
            def listener():
                loop.call_soon_threadsafe(_wake, sleep)
            if not subchannels.when_changed(self._since, listener):
                listener = None
                _wake(sleep)
        try:
            await sleep
        finally:
            if handle is not None:
                handle.cancel()
            if listener is not None:
                subchannels.remove_listener(listener)
            self._sleep = None

    async def _backoff(self) -> bool:
        """Sleep the core's delay, then count the next attempt. False when the call ended meanwhile."""
        delay = self._core.delay
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: attempt %d failed, retrying in %.3fs", id(self), self._core.attempts, delay)
        if delay > 0:
            await self._sleep_until(delay)
        if self._done:
            raise asyncio.CancelledError()
        return True

    # -- ending -----------------------------------------------------------------------------------------

    def _finish(self, code: grpc.StatusCode, details, initial, trailing, error: Optional[BaseException]):
        if self._done:
            return
        self._done = True
        self._core.finish()
        self._code, self._details, self._initial, self._trailing, self._error = (
            code, details, initial, trailing, error)
        self._wake_waiters()
        callbacks = self._callbacks
        if callbacks:
            self._callbacks = None
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:  # a callback's failure must not break the call
                    log.exception("done callback of %r failed", self)

    def _finish_from_error(self, error: AioRpcError):
        """End with the status of `error`, the attempt whose result is returned."""
        previous = self._previous()
        trailing = error.trailing_metadata()
        if previous > 0:
            trailing = _trailing_with_attempts(trailing, previous)
            error = AioRpcError(error.code(), error.initial_metadata(), trailing, error.details(),
                                error.debug_error_string())
        self._finish(error.code(), error.details(), error.initial_metadata(), trailing, error)

    def _finish_local(self, code: grpc.StatusCode, details: str):
        """End with a status that no server sent: deadline, cancellation, client-side failures."""
        initial, trailing = Metadata(), Metadata()
        error = AioRpcError(code, initial, trailing, details, None)
        if self._attempt is not None:
            self._attempt.cancel()
        self._finish(code, details, initial, trailing, error)

    def _previous(self) -> int:
        """Attempts made before the one whose result the application gets (its trailing metadata says so)."""
        return self._core.attempts - 1

    async def _finish_ok(self, attempt):
        previous = self._previous()
        trailing = await attempt.trailing_metadata()
        if previous > 0:
            trailing = _trailing_with_attempts(trailing, previous)
        self._finish(grpc.StatusCode.OK, await attempt.details(), await attempt.initial_metadata(), trailing,
                     None)

    def _wake_waiters(self):
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_driver(self):
        """Wait until whoever drives the call stops (the call ended, or a streaming call committed)."""
        if self._waiter is None:
            self._waiter = self._loop.create_future()
        await asyncio.shield(self._waiter)

    async def _settle(self):
        """Drive the call to its end if nobody else is, else wait for whoever is."""
        while not self._done:
            if self._driving:
                await self._wait_driver()
            else:
                await self._drive()

    async def _drive(self):  # overridden
        raise NotImplementedError

    def _ensure_driver(self):
        if not self._done and not self._driving and self._task is None:
            self._task = self._loop.create_task(self._drive_quietly())

    async def _drive_quietly(self):
        try:
            await self._settle()
        except BaseException:  # the outcome is recorded on the call; the task itself has no reader
            pass

    def _on_driver_cancelled(self):
        """The task driving this call was cancelled: as in grpc.aio, that cancels the call."""
        if not self._done:
            self.cancel()

    # -- grpc.aio.Call API ------------------------------------------------------------------------------

    def cancel(self) -> bool:
        if self._done:
            return False
        if self._sleep is not None and not self._sleep.done():
            self._sleep.cancel()
        self._finish_local(grpc.StatusCode.CANCELLED, _CANCELLED_DETAILS)
        return True

    def cancelled(self) -> bool:
        return self._code == grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable) -> None:
        if self._done:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)
        self._ensure_driver()

    def time_remaining(self) -> Optional[float]:
        deadline = self._core.deadline
        return None if deadline == _INF else max(deadline - monotonic(), 0.0)

    async def initial_metadata(self) -> Optional[Metadata]:
        await self._settle_headers()
        if self._done:
            return self._initial
        return await self._attempt.initial_metadata()

    async def _settle_headers(self):
        # Unary responses: headers arrive with the status, so the whole call is settled.
        await self._settle()

    async def trailing_metadata(self) -> Optional[Metadata]:
        await self._settle()
        return self._trailing

    async def code(self) -> grpc.StatusCode:
        await self._settle()
        return self._code

    async def details(self) -> str:
        await self._settle()
        return self._details

    async def debug_error_string(self) -> Optional[str]:
        await self._settle()
        return self._error.debug_error_string() if isinstance(self._error, AioRpcError) else None

    async def wait_for_connection(self) -> None:
        if self._attempt is not None and not self._done:
            await self._attempt.wait_for_connection()

    def _raise_if_failed(self):
        if self._error is not None:
            if self._code == grpc.StatusCode.CANCELLED and self._details == _CANCELLED_DETAILS:
                raise asyncio.CancelledError()
            raise self._error

    def __repr__(self):
        return f"<{type(self).__name__} done={self._done} code={self._code} core={self._core!r}>"


def _wake(future: asyncio.Future):
    if not future.done():
        future.set_result(None)


class _UnaryResponse(_RetryingCall):
    """Calls with one response (unary-unary, stream-unary): an attempt's whole result arrives at once."""

    __slots__ = ("_response",)

    def __await__(self):
        return self._result().__await__()

    async def _result(self):
        await self._settle()
        self._raise_if_failed()
        return self._response

    async def _drive(self):
        self._driving = True
        core = self._core
        try:
            while not self._done:
                attempt = self._attempt
                try:
                    if attempt is None:
                        await self._begin_or_fail()
                        continue
                    try:
                        response = await attempt
                    except AioRpcError as error:
                        if self._done:
                            break
                        started = await self._transparent(error.code(), error.details())
                        if started:
                            continue
                        if started is None:
                            self._finish_from_error(error)
                            break
                        # A unary attempt's headers arrive with its status. Metadata in them means the
                        # server sent real headers (committed); none is taken for Trailers-Only (README).
                        if error.initial_metadata():
                            core.on_headers()
                        if core.on_status(error.code().value[0], error.trailing_metadata(), monotonic()) == RETRY:
                            await self._backoff()
                            if await self._begin() is None:
                                self._finish_from_error(error)
                            continue
                        self._finish_from_error(error)
                        break
                except asyncio.CancelledError:
                    self._on_driver_cancelled()
                    raise
                core.on_status(0, None, 0.0)
                await self._finish_response(attempt, response)
        finally:
            self._driving = False
            self._wake_waiters()

    async def _finish_response(self, attempt, response) -> None:
        """End the call with `attempt`'s response, deserialized here, once."""
        if self._deserializer is not None:
            try:
                response = self._deserializer(response)
            except Exception:
                log.exception("response deserializer failed")
                self._finish_local(grpc.StatusCode.INTERNAL, "Exception deserializing response!")
                return
        self._response = response
        await self._finish_ok(attempt)


class _UnaryRequest:
    """Mixin for calls with one request: its bytes go to every attempt."""

    __slots__ = ()

    def _init_request(self, request: Optional[bytes]) -> None:
        self._request = request
        if request is None:  # the serializer raised: fail this call only
            self._finish_local(grpc.StatusCode.INTERNAL, "Exception serializing request!")
            return
        self._core.add_message(request)
        self._core.close_send()
        self._first_attempt()

    def _start_attempt(self) -> int:
        attempt = self._next_attempt()
        if attempt.__class__ is int:
            return attempt
        multicallable, metadata, timeout = attempt
        self._attempt = multicallable(
            self._request, timeout=timeout, metadata=metadata, credentials=self._credentials,
            wait_for_ready=self._grpc_wfr, compression=self._compression)
        return _STARTED


class UnaryUnaryCall(_UnaryRequest, _UnaryResponse, _base_call.UnaryUnaryCall):
    __slots__ = ("_request",)

    def __init__(self, state, multicallable, core, request: bytes, metadata, credentials, wait_for_ready,
                 compression, deserializer):
        super().__init__(state, multicallable, core, metadata, credentials, wait_for_ready, compression,
                         deserializer)
        self._response = None
        self._init_request(request)


class _StreamResponse(_RetryingCall):
    """Calls with a response stream (unary-stream, stream-stream): commit, then proxy reads."""

    __slots__ = ("_peeked",)

    async def _settle_headers(self):
        while not self._done and not self._answered:
            if self._driving:
                await self._wait_driver()
            else:
                await self._drive()

    async def _drive(self):
        """Run attempts until one commits or the call ends. An attempt commits with its first response
        message, or with headers that carry metadata; one that ends before either is taken as Trailers-Only
        (grpcio cannot tell an empty header frame apart, and timing would be a guess)."""
        self._driving = True
        core = self._core
        try:
            while not self._done and not self._answered:
                attempt = self._attempt
                try:
                    if attempt is None:
                        await self._begin_or_fail()
                        continue
                    try:
                        message = await attempt.read()
                    except AioRpcError:
                        message = _EOF
                    if self._done:
                        break
                    if message is not _EOF:
                        self._peeked = message
                        self._answered = True
                        core.on_headers()
                        break
                    if await attempt.initial_metadata():
                        self._answered = True
                        core.on_headers()
                        break
                    code = await attempt.code()
                    if code != grpc.StatusCode.OK:
                        started = await self._transparent(code, await attempt.details())
                        if started:
                            continue
                        if started is None:
                            await self._finish_attempt(attempt)
                            break
                    trailing = await attempt.trailing_metadata()
                    if core.on_status(code.value[0], trailing, monotonic()) == RETRY:
                        await self._backoff()
                        if await self._begin() is None:
                            await self._finish_attempt(attempt)
                        continue
                    await self._finish_attempt(attempt)
                except asyncio.CancelledError:
                    self._on_driver_cancelled()
                    raise
        finally:
            self._driving = False
            self._wake_waiters()

    async def _drain_status(self):
        attempt = self._attempt
        try:
            await attempt.code()
        except asyncio.CancelledError:
            self._on_driver_cancelled()
            raise
        if not self._done:
            await self._finish_attempt(attempt)

    def _account(self, code: grpc.StatusCode, trailing) -> None:
        """The committed attempt ended: the throttle counts it, as every call's end (A6 "Throttling")."""
        self._core.on_status(code.value[0], trailing, monotonic())

    async def _finish_attempt(self, attempt):
        code = await attempt.code()
        self._account(code, await attempt.trailing_metadata())
        if code == grpc.StatusCode.OK:
            await self._finish_ok(attempt)
        else:
            self._finish_from_error(AioRpcError(
                code, await attempt.initial_metadata(), await attempt.trailing_metadata(),
                await attempt.details(), await attempt.debug_error_string()))

    async def _settle(self):
        # The end of a streaming call is the end of its committed attempt.
        while not self._done:
            if self._driving:
                await self._wait_driver()
            elif not self._answered:
                await self._drive()
            else:
                await self._drain_status()

    async def read(self) -> Any:
        if not self._done and not self._answered:
            await self._settle_headers()
        if self._done:
            self._raise_if_failed()
            return _EOF
        attempt = self._attempt
        message = self._peeked
        try:
            if message is None:
                message = await attempt.read()
            else:
                self._peeked = None
        except AioRpcError as error:
            if not self._done:
                self._account(error.code(), error.trailing_metadata())
                self._finish_from_error(error)
            self._raise_if_failed()
            raise
        except asyncio.CancelledError:
            self._on_driver_cancelled()
            raise
        if message is _EOF:
            if not self._done:
                await self._finish_attempt(attempt)
            self._raise_if_failed()
            return _EOF
        if self._deserializer is not None:
            try:
                return self._deserializer(message)
            except Exception:
                log.exception("response deserializer failed")
                self._finish_local(grpc.StatusCode.INTERNAL, "Exception deserializing response!")
                self._raise_if_failed()
        return message

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self):
        while True:
            message = await self.read()
            if message is _EOF:
                return
            yield message


class UnaryStreamCall(_UnaryRequest, _StreamResponse, _base_call.UnaryStreamCall):
    __slots__ = ("_request",)

    def __init__(self, state, multicallable, core, request: bytes, metadata, credentials, wait_for_ready,
                 compression, deserializer):
        super().__init__(state, multicallable, core, metadata, credentials, wait_for_ready, compression,
                         deserializer)
        self._peeked = None
        self._init_request(request)


async def _send(attempt, data: bytes) -> bool:
    """Write bytes to a streaming attempt; False once it has ended. Not grpc.aio's write(): when a send fails
    because the server just ended the stream, write() overwrites the attempt's status with INTERNAL, hiding
    the (maybe retryable) status the server sent. Here the attempt keeps the status the server gave it."""
    if attempt.done():
        return False
    metadata_sent = attempt._metadata_sent
    if not metadata_sent.is_set():
        await metadata_sent.wait()
        if attempt.done():
            return False
    try:
        await attempt._cython_call.send_serialized_message(data)
    except cygrpc.InternalError:
        return False
    return True


class _StreamRequest:
    """Mixin for calls with a request stream: the application's messages go through the core's replay
    buffer; each attempt has a writer that replays what is buffered, then follows new messages."""

    __slots__ = ()

    def _init_requests(self, request_iterator, serializer):
        self._serializer = serializer
        self._more = asyncio.Event()
        self._iterator_given = request_iterator is not None
        self._consumer = None
        self._writer = None
        if request_iterator is not None:
            self._consumer = self._loop.create_task(self._consume(request_iterator))

    def _start_attempt(self) -> int:
        attempt = self._next_attempt()
        if attempt.__class__ is int:
            return attempt
        multicallable, metadata, timeout = attempt
        if self._writer is not None:
            self._writer.cancel()
        attempt = self._attempt = multicallable(
            None, timeout=timeout, metadata=metadata, credentials=self._credentials,
            wait_for_ready=self._grpc_wfr, compression=self._compression)
        self._writer = self._loop.create_task(self._write_attempt(attempt))
        return _STARTED

    async def _write_attempt(self, attempt, hedge: int = -1):
        """Replay what the call has buffered to `attempt`, then follow new messages. A hedge (index >= 0)
        reports how far it got, for the core to choose the winner if the buffer overflows."""
        core = self._core
        sent = 0
        try:
            while True:
                replay = core.replay
                index = sent - core.replay_base
                if index < len(replay):
                    if not await _send(attempt, replay[index]):
                        return
                    sent += 1
                    if hedge >= 0:
                        core.on_sent(hedge, sent)
                        if core.committed and hedge == core.winner:
                            core.trim_sent(sent)
                    elif core.committed:
                        core.trim_sent(sent)
                    continue
                if core.half_closed:
                    await attempt.done_writing()
                    return
                self._more.clear()
                await self._more.wait()
        except (asyncio.CancelledError, asyncio.InvalidStateError, AioRpcError, grpc.aio.UsageError):
            return  # the attempt ended; its status decides what happens next

    def _queue(self, message) -> None:
        if self._done:
            return
        try:
            data = self._serializer(message) if self._serializer is not None else message
        except Exception:
            log.exception("request serializer failed")
            self._fail_requests(grpc.StatusCode.INTERNAL, "Exception serializing request!")
            return
        self._core.add_message(data)
        self._more.set()

    def _close_requests(self) -> None:
        self._core.close_send()
        self._more.set()

    def _fail_requests(self, code, details):
        self._finish_local(code, details)
        if self._writer is not None:
            self._writer.cancel()

    async def _consume(self, request_iterator):
        try:
            if hasattr(request_iterator, "__aiter__"):
                async for message in request_iterator:
                    self._queue(message)
                    if self._done:
                        return
            else:
                for message in request_iterator:
                    self._queue(message)
                    if self._done:
                        return
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("request iterator failed")
            self._fail_requests(grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
            return
        self._close_requests()

    async def write(self, request) -> None:
        if self._iterator_given:
            raise grpc.aio.UsageError("write() is not allowed with a request iterator")
        if self._core.half_closed:
            raise grpc.aio.UsageError("write() after done_writing()")
        if self._done:
            self._raise_if_failed()
            raise asyncio.InvalidStateError("RPC already finished")
        self._queue(request)

    async def done_writing(self) -> None:
        if self._iterator_given:
            raise grpc.aio.UsageError("done_writing() is not allowed with a request iterator")
        if not self._core.half_closed:
            self._close_requests()

    def _stop_requests(self):
        for task in (self._consumer, self._writer):
            if task is not None and not task.done():
                task.cancel()


class StreamUnaryCall(_StreamRequest, _UnaryResponse, _base_call.StreamUnaryCall):
    __slots__ = ("_serializer", "_more", "_iterator_given", "_consumer", "_writer")

    def __init__(self, state, multicallable, core, request_iterator, serializer, metadata, credentials,
                 wait_for_ready, compression, deserializer):
        super().__init__(state, multicallable, core, metadata, credentials, wait_for_ready, compression,
                         deserializer)
        self._response = None
        self._init_requests(request_iterator, serializer)
        self._first_attempt()

    def _finish(self, *args):
        super()._finish(*args)
        self._stop_requests()


class StreamStreamCall(_StreamRequest, _StreamResponse, _base_call.StreamStreamCall):
    __slots__ = ("_serializer", "_more", "_iterator_given", "_consumer", "_writer")

    def __init__(self, state, multicallable, core, request_iterator, serializer, metadata, credentials,
                 wait_for_ready, compression, deserializer):
        super().__init__(state, multicallable, core, metadata, credentials, wait_for_ready, compression,
                         deserializer)
        self._peeked = None
        self._init_requests(request_iterator, serializer)
        self._first_attempt()

    def _finish(self, *args):
        super()._finish(*args)
        self._stop_requests()
