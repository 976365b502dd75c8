"""The asyncio call objects, one per cardinality (UnaryUnaryCall, UnaryStreamCall, StreamUnaryCall,
StreamStreamCall): grpc.aio's abstract call classes over the asyncio driver (aio/_driver.py), with what differs
between one message and a stream of them, each way."""

from __future__ import annotations

import asyncio
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, AsyncIterator, Generator, Optional, Tuple, cast

import grpc
from grpc.aio import AioRpcError, Metadata

from grpc_retry import _bases as bases
from grpc_retry._core import CallMachine
from grpc_retry._driver import CANCELLED_DETAILS, log
from grpc_retry.aio._driver import _Call

_EOF = grpc.aio.EOF
# grpc.aio's words
_API_STYLE_ERROR = "The iterator and read/write APIs may not be mixed on a single RPC."
_FINISHED = "RPC already finished."
_HALF_CLOSED = 'RPC is half closed after calling "done_writing".'


class _UnaryResponse(_Call):
    """Calls with one response (unary-unary, stream-unary)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, Any]:
        if not self._done:  # (a generator, not a coroutine: one frame less per call)
            waiter = self._end_waiter()
            waiter._asyncio_future_blocking = True  # (yielded as its own __await__ would, without its frame)
            try:
                yield waiter
                waiter.result()
            except asyncio.CancelledError:
                self.cancel()  # as grpc.aio: cancelling the task that awaits the call cancels the call
                raise
        self._raise_if_failed()
        return self._response


class _StreamResponse(_Call):
    """Calls with a response stream (unary-stream, stream-stream): once committed, reads go straight to the
    winning attempt; before that, a reader reads ahead on the attempt in flight, and its first message commits."""

    __slots__ = ()

    def _follow(self, n: int, attempt: Any) -> None:
        attempt.add_done_callback(partial(self._stream_ended, n))

    async def read(self) -> Any:
        if self._done and self._peek is None:
            self._raise_if_failed()
            return _EOF
        self._use("read")
        return await self._read_message()

    def _use(self, style: str) -> None:
        if self._style is None:
            self._style = style
        elif self._style != style:
            raise grpc.aio.UsageError(_API_STYLE_ERROR)

    def __aiter__(self) -> AsyncIterator[Any]:
        self._use("iterate")
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            message = await self._read_message()
            if message is _EOF:
                return
            yield message

    async def initial_metadata(self) -> Metadata:
        # As grpc.aio: as soon as the headers come. The application then has seen the attempt: it commits.
        while not self._done:
            n = self._winner if self._winner >= 0 else self._current
            attempt = self._attempts.get(n)
            if attempt is None or self._reads and n in self._reads:
                await self._next_change()
                continue
            if self._winner != n:
                await self._first_answer(n, attempt)
            if self._winner == n:
                return cast(Metadata, await attempt.initial_metadata())
            if self._attempts.get(n) is attempt:
                await self._next_change()  # it ended: its status is on its way to the machine
        return Metadata.from_tuple(self._initial)


_STREAM_REQUEST_SLOTS = ("_serializer", "_iterator_given", "_consumer", "_half_closed", "_ended_unseen", "_headers_out")


class _StreamRequest(_Call):
    """Calls with a request stream: the application's messages go to the machine, which writes them to every
    live attempt, one at a time, and replays them to each new one."""

    # The slots are the leaf classes' (two bases with slots of their own cannot be combined); mypy sees them here.
    __slots__ = _STREAM_REQUEST_SLOTS if TYPE_CHECKING else ()

    def __init__(self, method: Any, machine: CallMachine, request_iterator: Any, serializer: Any, metadata: Any,
                 credentials: Any, wait_for_ready: Optional[bool], compression: Any) -> None:
        super().__init__(method, machine, None, metadata, credentials, wait_for_ready, compression, True)
        self._serializer = serializer
        self._iterator_given = request_iterator is not None
        self._consumer: Optional[asyncio.Task[None]] = None
        self._half_closed = False
        self._headers_out = False  # the call's metadata has gone out: until then, as on grpc.aio, writes wait for it
        if request_iterator is not None:
            self._consumer = self._loop.create_task(self._consume(request_iterator))
        self._begin()
        # Ended before the application got the call (failed fast: no backend): grpc.aio's call would still be
        # sending its headers, and its first write() would fail with the call's status, not as "finished".
        self._ended_unseen = self._done

    async def wait_for_connection(self) -> None:
        """As grpc.aio: until the call's metadata has gone out; a call that has ended raises as awaiting it would."""
        await _until_sent(self)

    def _start(self, n: int, address: int, previous: int) -> None:
        super()._start(n, address, previous)
        attempt = self._attempts.get(n)
        if attempt is not None:
            attempt.on_written = partial(self._wrote, n, attempt)
            if not self._headers_out:
                attempt.on_sent = self._attempt_sent

    def _write(self, n: int, data: bytes) -> None:
        self._attempts[n].write(data)

    def _wrote(self, n: int, attempt: Any) -> None:
        if self._attempts.get(n) is attempt:
            self._decide("wrote", n, monotonic())

    def _half_close(self, n: int) -> None:
        self._attempts[n].half_close()

    def _attempt_sent(self) -> None:
        """An attempt's metadata went out: the application's writes, which waited for it, go."""
        if not self._headers_out:
            self._headers_out = True
            self._wake_readers()

    def _queue(self, message: Any) -> None:
        try:
            data = self._serializer(message) if self._serializer is not None else message
        except Exception:
            log.exception("request serializer failed")
            self._cancel("Exception serializing request!", 13)
            return
        self._act(self._machine.send_message(data, monotonic()))

    def _close_requests(self) -> None:
        self._half_closed = True
        if not self._done:
            self._act(self._machine.half_close(monotonic()))

    async def _consume(self, request_iterator: Any) -> None:
        try:
            # As grpc.aio's, one message is taken ahead of the call's metadata: it goes out right after them, and
            # the next is taken once they went.
            if hasattr(request_iterator, "__aiter__"):
                async for message in request_iterator:
                    if self._done:
                        return
                    self._queue(message)
                    await self._until_writable()
            else:
                for message in request_iterator:
                    if self._done:
                        return
                    self._queue(message)
                    await self._until_writable()
        except (asyncio.CancelledError, asyncio.InvalidStateError, AioRpcError):
            return  # the call ended: its status tells how
        except Exception:  # as grpc.aio: logged (at DEBUG), and the call cancelled
            log.debug("request iterator failed", exc_info=True)
            self._cancel(CANCELLED_DETAILS)
            return
        if not self._done:
            self._close_requests()

    async def write(self, request: Any) -> None:
        if self._iterator_given:
            raise grpc.aio.UsageError(_API_STYLE_ERROR)
        if self._done:
            if self._ended_unseen:
                self._ended_unseen = False
                self._raise_if_failed()
            raise asyncio.InvalidStateError(_FINISHED)
        if self._half_closed:
            raise asyncio.InvalidStateError(_HALF_CLOSED)
        try:
            await self._until_writable()
        except asyncio.CancelledError:
            # As a write on grpc.aio (most of whose wait is the message's send): cancelling the task that writes
            # cancels the call. (grpc.aio's shorter wait for its metadata does not; ours is the whole write.)
            self.cancel()
            raise
        self._queue(request)

    async def _until_writable(self) -> None:
        """grpc.aio's writes wait for the call's metadata to go out (a backend picked), and raise the call's error
        if it ends first: the first write of a call that cannot start fails with its status, and a request
        iterator is read no further ahead of the call than its first message."""
        while not self._headers_out and not self._done:
            await self._next_change()
        if self._done:
            self._raise_if_failed()
            raise asyncio.InvalidStateError(_FINISHED)

    @property
    def _done_writing_flag(self) -> bool:
        """What grpc.aio's stream-request interceptor calls read of the call under them before each write."""
        return self._half_closed

    async def done_writing(self) -> None:
        if self._iterator_given:
            raise grpc.aio.UsageError(_API_STYLE_ERROR)
        if not self._half_closed and not self._done:
            self._close_requests()

    def _stop_tasks(self) -> None:
        super()._stop_tasks()
        consumer = self._consumer
        if consumer is not None and not consumer.done() and consumer is not asyncio.current_task():
            # A loop turn later: a reader that has not run yet (the call failed fast) takes its first message
            # first, as grpc.aio's, which always starts before its call can end.
            self._loop.call_soon(consumer.cancel)


class _UnaryRequest(_Call):
    """Calls with one request: its bytes go with each attempt."""

    __slots__ = ()

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> None:
        super().__init__(method, machine, request, metadata, credentials, wait_for_ready, compression, False)
        if request is None:  # the serializer raised: fail this call only
            self._cancel("Exception serializing request!", 13)
        else:
            self._begin()

    async def wait_for_connection(self) -> None:
        """As grpc.aio's, whose wait is on the task that sends the request: cancelling the task that waits cancels
        that one, and the call with it."""
        try:
            await _until_sent(self)
        except asyncio.CancelledError:
            self.cancel()
            raise


class UnaryUnaryCall(_UnaryRequest, _UnaryResponse, bases.AioUnaryUnaryCall):
    __slots__ = ()


class UnaryStreamCall(_UnaryRequest, _StreamResponse, bases.AioUnaryStreamCall):
    __slots__ = ()


class StreamUnaryCall(_StreamRequest, _UnaryResponse, bases.AioStreamUnaryCall):
    __slots__ = _STREAM_REQUEST_SLOTS


class StreamStreamCall(_StreamRequest, _StreamResponse, bases.AioStreamStreamCall):
    __slots__ = _STREAM_REQUEST_SLOTS


async def _until_sent(call: _Call) -> None:
    """Until the call's metadata has gone out on the winner, else the attempt in flight; a call that has ended
    raises as awaiting it would."""
    while not call._done:
        n = call._winner if call._winner >= 0 else call._current
        attempt = call._attempts.get(n) if n >= 0 else None
        live = () if attempt is None or attempt.done() else (attempt,)
        if not live:
            await call._next_change()  # an attempt starts, or the machine hears how this one ended
        elif await _any_sent(call, live):
            return
    call._raise_if_failed()


async def _any_sent(call: _Call, attempts: Tuple[Any, ...]) -> bool:
    """Until one of `attempts` has sent its metadata (True), or the call changes (False: an attempt started,
    ended or lost, or the call ended). Each attempt's own wait runs in a task of its own: cancelling this
    wait must not cancel the attempt, and an attempt's failure is the machine's to judge, not this wait's.
    (grpc.aio's wait never ends for an attempt cancelled before its metadata went out: the call's change
    does, and the tasks go with this wait.)"""
    waiters = [call._loop.create_task(attempt.wait_for_connection()) for attempt in attempts]
    for waiter in waiters:
        waiter.add_done_callback(_retrieved)
    changed = call._change_waiter()
    try:
        await asyncio.wait((*waiters, changed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        changed.cancel()  # (no-op once done)
        for waiter in waiters:
            if not waiter.done():
                waiter.cancel()
    return any(waiter.done() and not waiter.cancelled() and waiter.exception() is None and not attempt.done()
               for waiter, attempt in zip(waiters, attempts, strict=True))


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
