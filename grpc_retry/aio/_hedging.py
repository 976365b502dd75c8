"""Hedged calls over grpc.aio (A6 "Hedging Policy"): the compiled HedgingCall decides, this module acts.

A hedged call runs several attempts at once, each on an address the call has not used, each watched by a
small task that reports the attempt's first event (a response, a message, headers, or its end) to the call's
driver. The driver feeds those events to the core and does what it says: start the hedges that are due,
cancel the losers once one attempt wins, deliver the final status. Once an attempt wins, the call is that
attempt's, and the plain call classes of _call.py run it to its end (reads, writes, status).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from time import monotonic
from typing import Any, Deque, Dict, Optional, Tuple

import grpc
from grpc.aio import AioRpcError

from grpc_retry._transparent import PARK, hedge_again
from grpc_retry.aio import _call
from grpc_retry.aio._call import _EOF, _INF, _UNAVAILABLE, PREVIOUS_ATTEMPTS, _wake

log = logging.getLogger("grpc_retry")

# What a watcher reports: (kind, attempt index, payload).
_RESPONSE, _MESSAGE, _HEADERS, _ENDED, _UNPARK = 0, 1, 2, 3, 4


class _Hedged:
    """Mixin over the call classes of _call.py: replaces their single-attempt driver with a hedging one."""

    __slots__ = ()

    def __init__(self, *args):
        self._init_hedging()
        super().__init__(*args)

    def _init_hedging(self) -> None:
        self._hedges: Dict[int, Any] = {}      # attempt index -> live grpc.aio call
        self._watchers: Dict[int, asyncio.Task] = {}
        self._writers: Dict[int, asyncio.Task] = {}
        self._ends: Dict[int, AioRpcError] = {}  # attempt index -> its failure, for delivery
        self._events: Deque[Tuple[int, int, Any]] = collections.deque()
        self._wakeup: Optional[asyncio.Future] = None
        self._parked: Dict[int, Any] = {}  # never-sent hedges waiting for a subchannel: index -> listener

    def _first_attempt(self) -> None:
        # The original goes at once; whoever awaits the call (or a done callback's task) then drives the hedges,
        # as with retries. With no address to take it yet, a task waits for one.
        now = monotonic()
        if not (self._core.hedge_due(now) and self._start_hedge(now)):
            self._ensure_driver()

    def _previous(self) -> int:
        final = self._core.final if self._core.finished else self._core.winner
        return max(final, 0)

    # -- the driver ---------------------------------------------------------------------------------------

    async def _drive(self):
        self._driving = True
        core = self._core
        try:
            while not self._done and not self._handed_over():
                now = monotonic()
                if now >= core.deadline:
                    self._finish_local(grpc.StatusCode.DEADLINE_EXCEEDED, _call._DEADLINE_DETAILS)
                    break
                while core.hedge_due(now):
                    if not self._start_hedge(now):
                        break  # due, but no address can take it now: the next event decides
                if core.finished:
                    await self._deliver()
                    break
                if core.winner >= 0 and self._hand_over():
                    break
                blocked = core.hedge_due(now)  # due, yet no address took it
                if blocked and not self._hedges and not self._parked and not self._events:
                    # Nothing live and no hedge could start: wait for an address, or give up.
                    if not await self._no_address():
                        break
                    continue
                event = await self._next_event(now, blocked)
                if event is not None:
                    await self._on_event(*event)
        except asyncio.CancelledError:
            self._on_driver_cancelled()
            raise
        finally:
            self._driving = False
            self._wake_waiters()

    def _handed_over(self) -> bool:
        return self._core.winner >= 0 and self._attempt is not None

    async def _next_event(self, now: float, blocked: bool):
        """The next watcher event, or None when the next hedge (or the deadline) is due. `blocked`: a hedge is
        due but found no address, so only an event (or the deadline) can change that."""
        if not self._events:
            core = self._core
            wait = (core.deadline if blocked else min(core.next_hedge_at, core.deadline)) - now
            loop = self._loop
            wakeup = self._wakeup = loop.create_future()
            handle = None if wait == _INF else loop.call_later(max(wait, 0.0), _wake, wakeup)
            try:
                await wakeup
            finally:
                if handle is not None:
                    handle.cancel()
                self._wakeup = None
        return self._events.popleft() if self._events else None

    def _post(self, kind: int, index: int, payload=None) -> None:
        self._events.append((kind, index, payload))
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _no_address(self) -> bool:
        """No attempt is live and none could start. True: an address may be back, try again."""
        core = self._core
        if core.attempts > 0 and self._ends:
            # A hedge was due but every address is down: the call ends with the last failure.
            self._finish_from_error(self._ends[max(self._ends)])
            return False
        started = await self._begin()
        if started is None:
            self._finish_local(_UNAVAILABLE, self._subchannels.unavailable_details())
        return False if started is None else not self._done

    def _start_attempt(self) -> int:
        # _begin() (waiting for an address) calls this for the original attempt, which is always due until
        # the deadline has passed.
        now = monotonic()
        if not self._core.hedge_due(now):
            return _call._DEADLINE
        return _call._STARTED if self._start_hedge(now) else _call._WAIT

    def _start_hedge(self, now: float) -> bool:
        core = self._core
        address = self._subchannels.pick(core.used)
        if address < 0:
            return False
        index = core.begin_attempt(now)
        core.use_address(address)
        self._launch(index, address, now)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: hedge %d on %s", id(self), index, self._subchannels.addresses[address])
        return True

    def _launch(self, index: int, address: int, now: float) -> None:
        metadata = self._metadata if index == 0 else self._metadata + ((PREVIOUS_ATTEMPTS, str(index)),)
        deadline = self._core.deadline
        attempt = self._open(self._multicallable.inner(address), metadata,
                             None if deadline == _INF else deadline - now, index)
        self._hedges[index] = attempt
        self._watchers[index] = self._loop.create_task(self._watch(index, attempt))

    def _open(self, multicallable, metadata, timeout, index):
        request = self._request if hasattr(self, "_request") else None
        attempt = multicallable(request, timeout=timeout, metadata=metadata, credentials=self._credentials,
                                wait_for_ready=self._grpc_wfr, compression=self._compression)
        if request is None:
            self._writers[index] = self._loop.create_task(self._write_attempt(attempt, index))
        return attempt

    # -- events -------------------------------------------------------------------------------------------

    async def _on_event(self, kind: int, index: int, payload) -> None:
        core = self._core
        if kind == _UNPARK:
            self._unpark(index)
            return
        attempt = self._hedges.get(index)
        if attempt is None:
            return  # cancelled meanwhile
        if kind == _RESPONSE:
            core.on_commit(index)
            core.on_status(index, 0, None, monotonic())
            if core.final == index:
                self._response = payload
        elif kind in (_MESSAGE, _HEADERS):
            core.on_commit(index)
            if kind == _MESSAGE and core.winner == index:
                self._peeked = payload
        else:
            error: AioRpcError = payload
            now = monotonic()
            if self._retry_transparently(index, error, now):
                return
            if error.initial_metadata():
                core.on_commit(index)
            self._ends[index] = error
            self._drop(index, cancel=False)
            core.on_status(index, error.code().value[0], error.trailing_metadata(), now)
        if core.winner >= 0:
            self._cancel_hedges(keep=core.winner)

    def _retry_transparently(self, index: int, error: AioRpcError, now: float) -> bool:
        again = hedge_again(self._core, self._subchannels, index, error.code().value[0], error.details(),
                            self._wait_for_ready, now)
        if again is None:
            return False
        address, since = again
        self._drop(index, cancel=False)
        if address == PARK:
            self._park(index, since)
        else:
            self._core.use_address(address)
            self._launch(index, address, now)
        return True

    def _park(self, index: int, since: int) -> None:
        loop = self._loop

        def listener():
            loop.call_soon_threadsafe(self._post, _UNPARK, index)

        self._parked[index] = listener
        if not self._subchannels.when_changed(since, listener):
            self._post(_UNPARK, index)  # they changed while we looked

    def _unpark(self, index: int) -> None:
        if self._parked.pop(index, None) is None or self._done:
            return
        since = self._subchannels.generation
        address = self._subchannels.pick(self._core.used)
        if address < 0:
            self._park(index, since)
            return
        self._core.use_address(address)
        self._launch(index, address, monotonic())

    async def _deliver(self) -> None:
        core = self._core
        final = core.final
        self._cancel_hedges(keep=final)
        if final < 0:
            self._finish_local(grpc.StatusCode.DEADLINE_EXCEEDED, _call._DEADLINE_DETAILS)
        elif final in self._ends:
            self._finish_from_error(self._ends[final])
        else:  # a unary response
            self._attempt = self._hedges[final]
            await self._finish_response(self._attempt, self._response)

    def _hand_over(self) -> bool:
        """The call committed to one attempt: from now on the plain call classes run it. False while the
        winner has not answered yet (overflow chose it)."""
        winner = self._core.winner
        attempt = self._hedges.get(winner)
        if attempt is None:
            return False
        self._cancel_hedges(keep=winner)
        watcher = self._watchers.get(winner)
        if watcher is not None and not watcher.done():
            # Chosen by overflow before it answered: its watcher reads the first answer (cancelling the
            # watcher would cancel the attempt), and the hand-over follows that event.
            return False
        self._watchers.pop(winner, None)
        self._attempt = attempt
        self._answered = True
        if winner in self._writers:
            self._writer = self._writers[winner]
        return True

    def _drop(self, index: int, cancel: bool) -> None:
        attempt = self._hedges.pop(index, None)
        for tasks in (self._watchers, self._writers):
            task = tasks.pop(index, None)
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()
        if cancel and attempt is not None:
            attempt.cancel()

    def _cancel_hedges(self, keep: int) -> None:
        for index in [i for i in self._hedges if i != keep]:
            self._drop(index, cancel=True)

    def _account(self, code: grpc.StatusCode, trailing) -> None:
        self._core.on_status(self._core.winner, code.value[0], trailing, monotonic())

    def _finish(self, *args):
        super()._finish(*args)
        if self._hedges:
            self._cancel_hedges(keep=-1)  # the delivered attempt is over: cancelling it does nothing
        for listener in self._parked.values():
            self._subchannels.remove_listener(listener)
        self._parked.clear()
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)


class _HedgedUnaryResponse(_Hedged):
    __slots__ = ()

    async def _watch(self, index: int, attempt) -> None:
        try:
            response = await attempt
        except AioRpcError as error:
            self._post(_ENDED, index, error)
        except asyncio.CancelledError:
            return
        else:
            self._post(_RESPONSE, index, response)

    def _handed_over(self) -> bool:
        return False  # the winner's response ends the call: _deliver() does it

    def _hand_over(self) -> bool:
        # Committed without an answer (buffer overflow): wait for the winner's result.
        self._cancel_hedges(keep=self._core.winner)
        return False


class _HedgedStreamResponse(_Hedged):
    __slots__ = ()

    async def _watch(self, index: int, attempt) -> None:
        try:
            try:
                message = await attempt.read()
            except AioRpcError:
                message = _EOF
            if message is not _EOF:
                self._post(_MESSAGE, index, message)
                return
            if await attempt.initial_metadata():
                self._post(_HEADERS, index)
                return
            code = await attempt.code()
            if code == grpc.StatusCode.OK:
                self._post(_HEADERS, index)  # an empty OK stream: the winner, like any answer
                return
            self._post(_ENDED, index, AioRpcError(
                code, await attempt.initial_metadata(), await attempt.trailing_metadata(),
                await attempt.details(), await attempt.debug_error_string()))
        except asyncio.CancelledError:
            return

    async def _settle_headers(self):
        while not self._done and not self._handed_over():
            if self._driving:
                await self._wait_driver()
            else:
                await self._drive()

    async def _settle(self):
        while not self._done:
            if self._driving:
                await self._wait_driver()
            elif not self._handed_over():
                await self._drive()
            else:
                await self._drain_status()


class _HedgedRequestStream:
    """Mixin for hedged calls with a request stream: an overflowing message wakes the driver."""

    __slots__ = ()

    def _queue(self, message) -> None:
        committed = self._core.committed
        super()._queue(message)
        if not committed and self._core.committed:
            self._post(_HEADERS, -1)  # overflow committed the call (or ended it): wake the driver to act


_SLOTS = ("_hedges", "_watchers", "_writers", "_ends", "_events", "_wakeup", "_parked")


class UnaryUnaryCall(_HedgedUnaryResponse, _call.UnaryUnaryCall):
    __slots__ = _SLOTS


class UnaryStreamCall(_HedgedStreamResponse, _call.UnaryStreamCall):
    __slots__ = _SLOTS


class StreamUnaryCall(_HedgedRequestStream, _HedgedUnaryResponse, _call.StreamUnaryCall):
    __slots__ = _SLOTS


class StreamStreamCall(_HedgedRequestStream, _HedgedStreamResponse, _call.StreamStreamCall):
    __slots__ = _SLOTS
