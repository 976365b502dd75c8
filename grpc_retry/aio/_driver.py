"""The asyncio driver (`_Call`, under the call objects of aio/_call.py): grpc.aio calls over the call machine, whose
attempts (the transport's, on subchannels) carry bytes.

A call makes progress from its creation, whether or not anyone awaits it: attempts report to the machine from the
done callbacks of their batches, the machine's timer is the channel's (`_timers`: one asyncio timer for all its
calls'), subchannel changes arrive through `call_soon_threadsafe`. No task runs per call but a request iterator's
reader and a hedged response stream's watcher (its headers come before its messages); whoever reads a response
stream reads the attempt in flight. The serializer runs once per message, the deserializer once per response.
"""

from __future__ import annotations

import asyncio
from asyncio import get_running_loop
from functools import partial
from time import monotonic
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Set,
    Tuple,
    cast,
)

import grpc
from grpc.aio import AioRpcError, Metadata

from grpc_retry import _driver as driver
from grpc_retry._core import CANCEL, END, CallMachine
from grpc_retry._driver import (
    CANCELLED_DETAILS,
    INF,
    STATUS_CODES,
    CallDriver,
    grpc_details,
    log,
    trailing_with_attempts,
)
from grpc_retry._method import DESERIALIZE_FAILED, UNDESERIALIZABLE
from grpc_retry._transport.ends import (
    EndWaiter,
    aio_headers_came,
    aio_initial_metadata,
    aio_locally_cancelled,
    aio_status,
)
from grpc_retry.aio import _timers

if TYPE_CHECKING:
    from grpc_retry._transport.protocol import AioAttempt

_EOF = grpc.aio.EOF
_OK, _CANCELLED = grpc.StatusCode.OK, grpc.StatusCode.CANCELLED
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]


class _Call(CallDriver):
    """The state and I/O that every cardinality shares."""

    __slots__ = (
        "_channel", "_loop", "_watched", "_attempts", "_last", "_current", "_winner", "_timer", "_listener",
        "_local_details", "_refusal",
        "_done", "_code", "_details", "_initial", "_trailing", "_debug", "_response", "_waiters", "_changed",
        "_callbacks", "_watchers", "_peek", "_reads", "_late", "_delivered", "_style", "__weakref__",
    )

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, stream_request: bool) -> None:
        if method.closed():
            raise grpc.aio.UsageError("Channel is closed.")  # as grpc.aio, at the call site
        if credentials is not None and not method.subchannels.secure:
            raise grpc.aio.UsageError("Call credentials are only valid on secure channels")
        self._init_driver(method, machine, request, metadata, credentials, wait_for_ready, compression,
                          stream_request)
        # grpc.aio's close before 1.83 finds the calls to cancel by scanning every task's frame for a `self` that is
        # a grpc.aio.Call, and raises on one with neither `_channel` nor `_cython_call`; a `_channel` that is no
        # grpc.aio channel's makes it pass ours by (we cancel our own).
        self._channel = None
        self._loop = get_running_loop()
        self._watched = machine.watched  # hedged, or timed per attempt: each attempt's first answer is watched
        self._attempts: Dict[int, Any] = {}   # live attempts by number
        self._last: Any = None                # the attempt whose status was reported last
        self._current = -1                    # the attempt in flight (not hedged): the one a reader reads ahead
        self._winner = -1
        self._timer: Optional[_timers.Entry] = None  # the machine's timer, armed
        self._listener: Optional[Callable[[], None]] = None
        self._local_details = ""
        self._refusal: Optional[BaseException] = None  # what grpc.aio raised instead of making an attempt
        self._done = False
        self._code: Optional[grpc.StatusCode] = None
        self._details: Optional[str] = None
        self._initial: Tuple[Any, ...] = ()     # raw pairs: a Metadata is made only when asked for
        self._trailing: Tuple[Any, ...] = ()
        self._debug: Optional[str] = None
        self._response: Any = None
        self._waiters: Optional[List[EndWaiter]] = None  # awaiting the end
        self._changed: Optional[List[asyncio.Future[None]]] = None  # readers awaiting an attempt, a commit or the end
        self._callbacks: Optional[List[Callable[[Any], None]]] = None
        self._watchers: Optional[Dict[int, Any]] = None  # watched response streams: each attempt's watcher task
        self._peek: Any = None       # the winner's first message, read before it won
        self._reads: Optional[Set[int]] = None  # attempts whose first message is being read before they won
        self._late: Optional[Dict[int, Any]] = None  # attempts of _reads that ended meanwhile: told after the read
        self._delivered = False      # a response message reached the application
        self._style: Optional[str] = None  # response streams: "read" or "iterate", as the application first did

    def _begin(self) -> None:
        self._method.calls.add(self)
        self._act(self._machine.start(monotonic(), self._request))

    # -- actions ----------------------------------------------------------------------------------------------

    def _start(self, n: int, address: int, previous: int) -> None:
        method = self._method
        deadline = self._machine.deadline
        # A hedged unary call's first attempt is out alone: one batch, unless the method's headers are watched
        whole = n == 0 and self._watched and method.direct and method.first_whole()
        try:
            inner = method.inner(address)
            attempt = (inner.whole if whole else inner)(
                self._request, timeout=None if deadline == INF else deadline - monotonic(),
                metadata=self._attempt_metadata(n, previous), credentials=self._credentials,
                wait_for_ready=self._grpc_wfr, compression=self._compression)
        except Exception as error:  # grpc.aio refused the call
            self._refused(error)
            return
        self._attempts[n] = attempt
        if method.direct:  # a unary response
            if whole:
                attempt.on_end = partial(self._direct_ended, n, attempt)
            elif self._watched:
                attempt.on_headers = partial(self._headers_came, n, attempt)
                attempt.on_end = partial(self._headers_first_ended, n, attempt)
            else:
                self._current = n
                attempt.on_end = partial(self._direct_ended, n, attempt)
        elif self._watched and not self._machine.hedging:
            # A timed response stream: the attempt tells its headers, which stop its timer; a reader reads ahead
            # on it, as on an untimed call's.
            self._current = n
            attempt.on_headers = partial(self._headers_came, n, attempt)
            self._follow(n, attempt)
        elif self._watched:  # a hedged response stream
            if self._watchers is None:
                self._watchers = {}
            self._watchers[n] = self._loop.create_task(self._watch(n, attempt))
        else:
            self._current = n
            self._follow(n, attempt)
        self._wake_readers()

    def _refused(self, error: BaseException) -> None:
        """grpc.aio refused an attempt (metadata it cannot send, say): awaiting the call raises that error, as on
        grpc.aio; the call ends INTERNAL."""
        log.debug("grpc_retry could not start an attempt: %r", error)  # (raised, or in the status details)
        self._refusal = error
        self._cancel(f"grpc_retry could not start an attempt: {error!r}", 13)

    def _follow(self, n: int, attempt: Any) -> None:  # response streams: report the attempt's end
        raise NotImplementedError

    def _cancel_attempt(self, n: int) -> None:
        # Forget it first: its done callback, run inline by cancel(), must find it gone. (It is gone already when
        # it ended by someone else's cancel, which ends the call.)
        attempt = self._attempts.pop(n, None)
        if self._watchers is not None:
            watcher = self._watchers.pop(n, None)
            if watcher is not None:
                watcher.cancel()
        if attempt is not None:
            attempt.cancel()

    def _commit(self, n: int) -> None:
        self._winner = n
        self._wake_readers()

    def _arm(self, at: float) -> None:
        timer = self._timer
        if timer is not None:
            self._timer = None
            self._method.timers.disarm(timer)
        if at != INF:
            self._timer = self._method.timers.arm(at, self)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._done:
            self._decide("timer", monotonic())

    def _flush(self) -> None:
        # A loop turn later, the completions queued with the timer, and the tasks they wake (grpc.aio's own, for
        # the portable transport's attempts), have run.
        self._loop.call_soon(self._flushed)

    def _flushed(self) -> None:
        """The machine's FLUSH, a loop turn later: tell it the headers that came meanwhile and wait queued."""
        if self._done:
            return
        now = monotonic()
        for n, attempt in list(self._attempts.items()):
            if n != self._winner and aio_headers_came(attempt) and self._attempts.get(n) is attempt:
                self._decide("headers", n, now, not aio_initial_metadata(attempt))
        if not self._done:
            self._decide("flushed", monotonic())

    def _wait(self, generation: int) -> None:
        loop = self._loop

        def listener() -> None:
            loop.call_soon_threadsafe(self._on_change, listener)

        self._listener = listener
        if not self._method.subchannels.when_changed(generation, listener):
            loop.call_soon(self._on_change, listener)  # they changed while the machine looked

    def _on_change(self, listener: Any) -> None:
        if self._listener is listener and not self._done:
            self._listener = None
            self._decide("subchannels_changed", monotonic())

    def _decide(self, event: str, *args: Any) -> None:
        """Feed the machine an event (the name of its method) that comes on a loop callback or a task of the
        call's, and act on it. If the machine fails (a bug), the call ends INTERNAL: asyncio would only log the
        error and leave it. (By name: a method of the typed machine is a C function, not an object to pass.)"""
        try:
            actions = getattr(self._machine, event)(*args)
        except Exception:
            actions = self._broken()
        self._act(actions)

    def _broken(self) -> List[Any]:
        """(In an exception handler.) The machine failed deciding an event: what ends the call INTERNAL."""
        self._local_details = driver.INTERNAL_DETAILS
        return driver.broken(self._attempts)

    def _act(self, actions: List[Any]) -> None:
        """Perform what the machine decided. If that fails (a bug), the call ends INTERNAL, its attempts
        cancelled: on a loop callback the error would only be logged, and the call left."""
        try:
            CallDriver._act(self, actions)
        except Exception:
            log.exception("grpc_retry could not perform what the call's machine decided")
            if self._done:
                return
            self._local_details = driver.INTERNAL_DETAILS
            try:
                CallDriver._act(self, [(CANCEL, n) for n in sorted(self._attempts)] + [(END, _INTERNAL)])
            finally:
                if not self._done:
                    self._finish(grpc.StatusCode.INTERNAL, driver.INTERNAL_DETAILS, (), (), None)

    def _unwait(self) -> None:
        listener, self._listener = self._listener, None
        self._method.subchannels.remove_listener(listener)

    def _deliver(self, n: int) -> None:
        attempt, previous = self._last, self._machine.previous(n)
        status = aio_status(attempt)  # never None: _ended() took such an attempt as cancelled
        assert status is not None
        code = STATUS_CODES[status.code()]
        trailing = status.trailing_metadata()
        if previous > 0:
            trailing = trailing_with_attempts(trailing, previous)
        initial = aio_initial_metadata(attempt)
        if code is _OK and self._response is not None:
            self._response = self._method.deserialize(self._response)
            if self._response is UNDESERIALIZABLE:
                self._finish(grpc.StatusCode.INTERNAL, DESERIALIZE_FAILED, (), (), None)
                return
        details = grpc_details(status.details(), bool(initial) or self._delivered, self._method.subchannels)
        self._finish(code, details, initial, trailing, None if code is _OK else status.debug_error_string())

    def _end(self, code: int) -> None:
        self._peek = None  # ended here (cancelled, deadline): as on grpc.aio, reads raise, unread messages go
        status, details = driver.local_status(code, self._local_details, self._method.subchannels, self._machine)
        self._finish(status, details, (), (), None)

    # -- what the attempts report ---------------------------------------------------------------------------------

    def _ended(self, n: int, attempt: Any, headers: bool, response: bool) -> None:
        """Attempt n is over: tell the machine its end record (unless it was cancelled: then it is not ours).
        `headers`: its response headers carried metadata; `response`: its response came with its end."""
        if self._attempts.get(n) is not attempt:
            return
        del self._attempts[n]
        if self._current == n:
            self._current = -1
        refusal = attempt.refusal  # type: ignore[union-attr]  # (the portable transport's: grpc.aio refuses late)
        if refusal is not None:
            self._refused(refusal)
            return
        status = aio_status(attempt)
        if status is None or aio_locally_cancelled(attempt):
            # Not by us (we forget an attempt before cancelling it): the application cancelled a task reading it,
            # and grpc.aio cancelled the RPC, as it does for its own calls.
            self._cancel(CANCELLED_DETAILS)
            return
        self._last = attempt
        code = status.code()
        try:
            if code == 0:
                actions = self._machine.status(n, 0, None, None, monotonic(), headers, response)
            else:
                actions = self._machine.status(n, code, status.details(), status.trailing_metadata(), monotonic(),
                                               headers, response)
        except Exception:  # as in _decide (inline: every call comes here)
            actions = self._broken()
        self._act(actions)
        self._wake_readers()

    async def _first_answer(self, n: int, attempt: Any) -> None:
        """Tell the machine when attempt n answers — response headers, or its first message — which commits the
        call to it; return when it has, or when the attempt has ended without answering. A message read here
        is kept for the winner's first read (`_peek`)."""
        metadata = await attempt.initial_metadata()
        if attempt.done() or self._attempts.get(n) is not attempt or self._winner == n:
            return  # ended, cancelled, or already the call's (overflow): the application reads it
        self._decide("headers", n, monotonic(), not metadata)
        if metadata or self._winner == n or self._attempts.get(n) is not attempt:
            return
        # Empty headers (the machine judges the silence after them): read ahead, as a message commits the call
        # (readers of n wait meanwhile).
        message = await self._read_ahead(n, attempt)
        if message is not _EOF and self._winner == n:
            self._peek = message

    async def _read_ahead(self, n: int, attempt: Any) -> Any:
        """Attempt n's next message (EOF once it ended), read before the call committed to it: a message commits
        the call to it. An end the attempt tells meanwhile is told after the read (_stream_ended): C-core ended the
        read first, but the attempt may tell its end on an earlier loop turn than the read's."""
        reading = attempt.read()
        if reading is None:
            return _EOF
        if self._reads is None:
            self._reads = set()
        self._reads.add(n)
        message = _EOF
        try:
            message = await reading
        except AioRpcError:
            pass
        finally:  # (also when the reading task is cancelled: the end that waited is told)
            self._reads.discard(n)
            if message is not _EOF and self._winner != n and self._attempts.get(n) is attempt:
                self._decide("message", n, monotonic())
            late = self._late.pop(n, None) if self._late else None
            if late is not None:
                self._ended(n, late, bool(aio_initial_metadata(late)), False)
            self._wake_readers()
        return message

    def _stream_ended(self, n: int, attempt: Any) -> None:
        """A response stream's attempt n ended: the machine hears of it, after a read of it in flight."""
        if self._reads and n in self._reads:
            if self._late is None:
                self._late = {}
            self._late[n] = attempt
            return
        self._ended(n, attempt, bool(aio_initial_metadata(attempt)), False)

    async def _watch(self, n: int, attempt: Any) -> None:
        """A hedge of a response stream: report its first answer, which commits the call, then its end."""
        try:
            await self._first_answer(n, attempt)
            await attempt.code()
        finally:
            if self._watchers is not None and self._watchers.get(n) is asyncio.current_task():
                del self._watchers[n]
        # Headers with metadata that came with its end, before this watcher saw them, were real ones (a
        # Trailers-Only response's are empty): they commit the call.
        self._ended(n, attempt, bool(aio_initial_metadata(attempt)), False)

    def _headers_came(self, n: int, attempt: AioAttempt) -> None:
        """A watched attempt's headers came, told by the attempt (a hedged unary one's, a timed one's)."""
        if self._attempts.get(n) is attempt and self._winner != n:
            self._decide("headers", n, monotonic(), not aio_initial_metadata(attempt))

    def _headers_first_ended(self, n: int, attempt: AioAttempt, response: Any) -> None:
        """A watched unary attempt ended, with its response or EOF: its status goes to the machine, and a
        response commits the call to it first (unless its headers did already): an OK status then delivers it."""
        if self._attempts.get(n) is not attempt:
            return
        if response is not _EOF:
            self._response = response
        self._ended(n, attempt, bool(aio_initial_metadata(attempt)), response is not _EOF)

    def _direct_ended(self, n: int, attempt: AioAttempt, response: Any) -> None:
        """A unary-unary attempt as one batch (unhedged, or a hedged call's first: `_start`) ended, with its
        response or EOF: its headers and its response came with its end."""
        if self._attempts.get(n) is not attempt:
            return
        if response is not _EOF:
            self._response = response
        self._ended(n, attempt, bool(aio_initial_metadata(attempt)), response is not _EOF)

    # -- ending ---------------------------------------------------------------------------------------------------

    def _cancel(self, details: str, code: int = 1) -> bool:
        if self._done:
            return False
        self._local_details = details
        self._decide("cancel", code, monotonic())
        return True

    def _finish(self, code: grpc.StatusCode, details: Optional[str], initial: Tuple[Any, ...],
                trailing: Tuple[Any, ...], debug: Optional[str]) -> None:
        self._done = True
        self._method.calls.discard(self)
        self._code, self._details, self._debug = code, details, debug
        self._initial, self._trailing = initial, trailing
        self._stop_tasks()
        waiters, self._waiters = self._waiters, None
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._wake_readers()
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:  # a callback's failure must not break the call
                    log.exception("done callback of %r failed", self)

    def _stop_tasks(self) -> None:
        watchers = self._watchers
        if watchers:
            current = asyncio.current_task()
            for watcher in watchers.values():
                if watcher is not current:
                    watcher.cancel()
            watchers.clear()

    def _wake_readers(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = None
            for waiter in changed:
                if not waiter.done():  # (else cancelled with the task that awaited it)
                    waiter.set_result(None)

    def _change_waiter(self) -> asyncio.Future[None]:
        """A future of one waiter's own that the call's next change completes: cancelling the task that awaits
        it cancels only that wait, and the task wakes a loop turn after the change (a shared future would need
        a shield: a turn more)."""
        waiter = self._loop.create_future()
        if self._changed is None:
            self._changed = [waiter]
        else:
            self._changed.append(waiter)
        return waiter

    async def _next_change(self) -> None:
        """Until an attempt starts, the call commits or ends."""
        await self._change_waiter()

    async def _until_done(self) -> None:
        """Until the call ends. Cancelling the waiting task cancels only this wait."""
        if not self._done:
            await self._end_waiter()

    def _end_waiter(self) -> EndWaiter:
        """A future (in what a task asks of one) that the call's end completes."""
        waiter = EndWaiter(self._loop)
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        return waiter

    def _error(self) -> AioRpcError:
        return AioRpcError(cast(grpc.StatusCode, self._code), Metadata.from_tuple(self._initial),
                           Metadata.from_tuple(self._trailing), self._details, self._debug)

    def _raise_if_failed(self) -> None:
        if self._refusal is not None:
            raise self._refusal
        if self._code is not _OK:
            if self._code is _CANCELLED and self._details == CANCELLED_DETAILS:
                raise asyncio.CancelledError()
            raise self._error()

    async def _read_message(self) -> Any:
        """A response stream's next message (_StreamResponse's; here, on the compiled base, `self` is typed:
        its fields are read as C fields, not looked up by name, ~8 lookups a message less)."""
        message = _EOF
        try:
            while not self._done:
                n = self._winner
                if n < 0:
                    n = self._current  # (-1 while a watcher waits for each attempt's first answer: hedges)
                    if n < 0:
                        await self._next_change()
                        continue
                attempt = self._attempts.get(n)
                if attempt is None or self._reads and n in self._reads:
                    await self._next_change()
                    continue
                message, self._peek = self._peek, None
                if message is None and self._winner != n:
                    message = await self._read_ahead(n, attempt)
                elif message is None:  # the winner's next message (inlined: a frame less per message)
                    reading = attempt.read()
                    if reading is None:
                        message = _EOF
                    else:
                        try:
                            message = await reading
                        except AioRpcError:
                            message = _EOF
                if message is not _EOF:
                    if self._winner == n:
                        break
                    message = _EOF  # an attempt no longer the call's (cancelled while read): not the call's
                    continue
                if self._attempts.get(n) is attempt:
                    await self._next_change()  # it ended: its status is on its way to the machine
                # The machine has its status: it retried, or ended the call.
        except asyncio.CancelledError:
            self.cancel()
            raise
        if message is _EOF and self._peek is not None:
            # The winner's first message, read ahead before it won; the winner ended before it was read.
            message, self._peek = self._peek, None
        if message is _EOF:
            self._raise_if_failed()
            return _EOF
        response = self._method.deserialize(message)
        if response is UNDESERIALIZABLE:
            self._cancel(DESERIALIZE_FAILED, 13)
            self._raise_if_failed()
        self._delivered = True
        return response

    # -- grpc.aio.Call ----------------------------------------------------------------------------------------

    def cancel(self) -> bool:
        return self._cancel(CANCELLED_DETAILS)

    def cancelled(self) -> bool:
        return self._code is _CANCELLED

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._done:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def time_remaining(self) -> Optional[float]:
        deadline = self._machine.deadline
        return None if deadline == INF else max(deadline - monotonic(), 0.0)

    async def initial_metadata(self) -> Metadata:
        await self._until_done()
        return Metadata.from_tuple(self._initial)

    async def trailing_metadata(self) -> Metadata:
        await self._until_done()
        return Metadata.from_tuple(self._trailing)

    async def code(self) -> grpc.StatusCode:
        await self._until_done()
        return cast(grpc.StatusCode, self._code)

    async def details(self) -> str:
        await self._until_done()
        return cast(str, self._details)

    async def debug_error_string(self) -> Optional[str]:
        await self._until_done()
        return self._debug or ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} done={self._done} code={self._code} machine={self._machine!r}>"

