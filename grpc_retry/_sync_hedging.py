"""Hedged calls over grpc's sync API (A6 "Hedging Policy"): the compiled HedgingCall decides, this module acts.

Each hedge is a plain grpc sync call on an address the call has not used. Unary-response hedges are grpc
futures whose done callbacks report to the call; hedge timers run on the shared timer thread: no thread per
call. Response-streaming hedges need a blocking read to see their first answer, so while a call hedges, each of
its hedges' first read runs on a small shared pool; once one answers, the call is that attempt's and the
application's thread reads it, as for any call.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from time import monotonic
from typing import Any, Dict, Optional

import grpc

from grpc_retry._sync_call import (
    _DEADLINE_DETAILS,
    _OK,
    WAIT,
    Attempts,
    ResponseIterator,
    RpcError,
    _CallBase,
    attempt_metadata,
    attempt_timeout,
    local_error,
    log,
    with_attempts,
)
from grpc_retry._timer import TIMERS
from grpc_retry._transparent import PARK, hedge_again

_INF = float("inf")
_RESPONSE, _MESSAGE, _HEADERS, _ENDED = 0, 1, 2, 3

_readers: Optional[concurrent.futures.ThreadPoolExecutor] = None
_readers_lock = threading.Lock()


def _reader_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="grpc_retry-hedge")
        return _readers


class HedgedCall(ResponseIterator, _CallBase):
    """A hedged call: a grpc.Future and grpc.Call; for response streams also the response iterator."""

    def __init__(self, attempts: Attempts, registry, streaming: bool):
        super().__init__(attempts, registry)
        self._streaming = streaming
        self._hedges: Dict[int, Any] = {}          # attempt index -> live grpc call
        self._ends: Dict[int, grpc.RpcError] = {}  # attempt index -> its failure, for delivery
        self._answered = threading.Condition(self._lock)  # notified at hand-over and at the end
        self._handed_over = False
        self._parked: Dict[int, Any] = {}  # never-sent hedges waiting for a subchannel: index -> listener
        self._follow = False  # somebody waits for the end without reading: follow the winner once chosen
        self._peeked = None
        if attempts.requests is not None:
            attempts.requests.on_commit = self._on_overflow
        with self._lock:
            self._pump()

    # -- deciding -----------------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Act on the core's state (under the lock): start due hedges, hand over, deliver, arm the timer."""
        core = self._core
        if self._done.is_set():
            return
        now = monotonic()
        if now >= core.deadline:
            self._finish(local_error(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS))
            return
        while core.hedge_due(now):
            if not self._start_hedge(now):
                break
        if self._done.is_set():
            return  # a hedge that ended at once (its callback ran inside add_done_callback) ended the call
        if core.finished:
            self._deliver()
            return
        if core.winner >= 0:
            self._cancel_hedges(keep=core.winner)
        blocked = core.hedge_due(now)  # due, yet no address took it
        if blocked and not self._hedges and not self._parked:
            if core.attempts > 0 and self._ends:
                self._finish(self._final_error(self._ends[max(self._ends)]))
                return
            error = self._attempts.ending(WAIT)
            if error is not None:
                self._finish(error)
                return
            if not self._attempts.subchannels.when_changed(self._attempts.since, self._on_change):
                TIMERS.schedule(0.0, self._on_change)  # changed while we looked: look again
            else:
                self._listening = True
        at = core.deadline if blocked else min(core.next_hedge_at, core.deadline)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if at != _INF and not self._handed_over:
            self._timer = TIMERS.schedule(at - now, self._on_timer)

    def _on_overflow(self) -> None:
        # The request stream overflowed the buffer (the core committed, or ended the call): act on it, off the
        # request-consumer thread's locks.
        TIMERS.schedule(0.0, self._pump_now)

    def _pump_now(self) -> None:
        with self._lock:
            self._pump()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None  # this one fired: nothing to cancel
            self._pump()

    def _on_change(self) -> None:
        with self._lock:
            if self._listening:
                self._listening = False
                self._attempts.subchannels.remove_listener(self._on_change)
            if self._attempts.closed():
                self._finish(local_error(grpc.StatusCode.CANCELLED, "Channel closed!"))
            else:
                self._pump()

    def _start_hedge(self, now: float) -> bool:
        attempts, core = self._attempts, self._core
        attempts.since = attempts.subchannels.generation
        address = attempts.subchannels.pick(core.used)
        if address < 0:
            return False
        index = core.begin_attempt(now)
        core.use_address(address)
        self._launch(index, address, now)
        return True

    def _launch(self, index: int, address: int, now: float) -> None:
        a = self._attempts
        kwargs = dict(timeout=attempt_timeout(self._core, now), metadata=attempt_metadata(a.metadata, index),
                      credentials=a.credentials, wait_for_ready=a.grpc_wait_for_ready(), compression=a.compression)
        payload = a.request if a.requests is None else a.requests.attempt_iterator(index)
        multicallable = a.inner(address)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: hedge %d on %s", id(self._core), index, a.subchannels.addresses[address])
        if self._streaming:
            call = self._hedges[index] = multicallable(payload, **kwargs)
            _reader_pool().submit(self._read_first, index, call)
        else:
            call = self._hedges[index] = multicallable.future(payload, **kwargs)
            call.add_done_callback(lambda future: self._on_done(index, future))

    # -- what the hedges report ---------------------------------------------------------------------------

    def _on_done(self, index: int, future) -> None:
        """A unary-response hedge ended (grpcio's callback)."""
        with self._lock:
            if self._hedges.get(index) is not future:
                return  # a loser we cancelled, or replaced by its transparent retry
            error = future.exception()
            if error is None:
                self._on_event(_RESPONSE, index, future.result())
            else:
                self._on_event(_ENDED, index, error)

    def _read_first(self, index: int, call) -> None:
        """A response-streaming hedge's first answer (on the reader pool)."""
        try:
            kind, payload = _MESSAGE, next(call)
        except (StopIteration, grpc.RpcError):
            if call.initial_metadata() or call.code() == _OK:
                kind, payload = _HEADERS, None  # headers, or an empty OK stream: an answer all the same
            else:
                kind, payload = _ENDED, call  # grpcio's call object is its own RpcError
        with self._lock:
            if self._hedges.get(index) is call:
                self._on_event(kind, index, payload)

    def _on_event(self, kind: int, index: int, payload) -> None:
        core = self._core
        if self._done.is_set():
            return
        now = monotonic()
        if kind == _RESPONSE:
            core.on_commit(index)
            core.on_status(index, 0, None, now)
            if core.final == index:
                self._response = payload
        elif kind in (_MESSAGE, _HEADERS):
            core.on_commit(index)
            if core.winner == index:
                self._peeked = payload
                self._hand_over(index)
                return
        else:
            error: grpc.RpcError = payload
            if self._retry_transparently(index, error, now):
                return
            if error.initial_metadata():
                core.on_commit(index)
            self._ends[index] = error
            self._hedges.pop(index, None)
            core.on_status(index, error.code().value[0], error.trailing_metadata(), now)
        self._pump()

    def _retry_transparently(self, index: int, error: grpc.RpcError, now: float) -> bool:
        again = hedge_again(self._core, self._attempts.subchannels, index, error.code().value[0], error.details(),
                            self._attempts.wait_for_ready, now)
        if again is None:
            return False
        address, since = again
        self._hedges.pop(index, None)
        if address == PARK:
            self._park(index, since)
        else:
            self._core.use_address(address)
            self._launch(index, address, now)
        return True

    def _park(self, index: int, since: int) -> None:
        def listener():
            self._unpark(index)

        self._parked[index] = listener
        if not self._attempts.subchannels.when_changed(since, listener):
            TIMERS.schedule(0.0, listener)  # they changed while we looked

    def _unpark(self, index: int) -> None:
        with self._lock:
            if self._parked.pop(index, None) is None or self._done.is_set():
                return
            subchannels = self._attempts.subchannels
            since = subchannels.generation
            address = subchannels.pick(self._core.used)
            if address < 0:
                self._park(index, since)
                return
            self._core.use_address(address)
            self._launch(index, address, monotonic())

    # -- ending -------------------------------------------------------------------------------------------

    def _deliver(self) -> None:
        final = self._core.final
        self._cancel_hedges(keep=final)
        if final < 0:
            self._finish(local_error(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS))
        elif final in self._ends:
            self._finish(self._final_error(self._ends[final]))
        elif not self._streaming:
            self._attempt = self._hedges[final]
            try:
                response = self._attempts.deserialize(self._response)
            except Exception:
                log.exception("response deserializer failed")
                self._finish(local_error(grpc.StatusCode.INTERNAL, "Exception deserializing response!"))
                return
            self._finish(None, response)

    def _hand_over(self, winner: int) -> None:
        """A response stream answered: the call is that attempt's; the application's thread reads it."""
        self._cancel_hedges(keep=winner)
        self._attempt = self._hedges[winner]
        self._handed_over = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._answered.notify_all()
        if self._follow:
            self._follow_winner()

    def _cancel_hedges(self, keep: int) -> None:
        for index in [i for i in self._hedges if i != keep]:
            self._hedges.pop(index).cancel()

    def _finish(self, error, response=None) -> bool:
        with self._lock:
            finished = super()._finish(error, response)
            if finished:
                self._cancel_hedges(keep=-1)  # the delivered attempt is over: cancelling it does nothing
                for listener in self._parked.values():
                    self._attempts.subchannels.remove_listener(listener)
                self._parked.clear()
                self._answered.notify_all()
            return finished

    def _fail_local(self, code: grpc.StatusCode, details: str) -> None:
        self._finish(local_error(code, details))

    def _previous(self) -> int:
        core = self._core
        return max(core.final if core.finished else core.winner, 0)

    def _final_error(self, error: grpc.RpcError) -> grpc.RpcError:
        previous = self._previous()
        return error if previous == 0 else RpcError.from_error(error, previous)

    def trailing_metadata(self):
        self._wait(None)
        if self._error is not None:
            return self._error.trailing_metadata()
        previous = self._previous()
        trailing = self._attempt.trailing_metadata()
        return trailing if previous == 0 else with_attempts(trailing, previous)

    # -- response streams ---------------------------------------------------------------------------------

    def _await_answer(self) -> None:
        with self._lock:
            while not self._handed_over and not self._done.is_set():
                self._answered.wait()

    def _finish_attempt(self, attempt) -> None:
        code = attempt.code()
        core = self._core
        with self._lock:
            if self._done.is_set():
                return
            core.on_status(core.winner, code.value[0], attempt.trailing_metadata(), monotonic())
        if code == _OK:
            self._finish(None)
        else:
            self._finish(self._final_error(RpcError(code, attempt.details(), attempt.initial_metadata(),
                                                    attempt.trailing_metadata(),
                                                    getattr(attempt, "debug_error_string", lambda: None)())))

    def _follow_winner(self) -> None:
        attempt = self._attempt
        if not attempt.add_callback(lambda: self._finish_attempt(attempt)):
            TIMERS.schedule(0.0, lambda: self._finish_attempt(attempt))

    def _need_driver(self) -> None:
        if not self._streaming:
            return  # unary hedges end in grpcio's callbacks
        if self._handed_over:
            self._follow_winner()
        else:
            self._follow = True

    def _settle(self, timeout) -> None:
        if not self._streaming:
            return
        self._await_answer()
        if not self._done.is_set():
            self._attempt.code()  # blocks until the winner ends
            self._finish_attempt(self._attempt)

    _ready_to_read = _await_answer

    def initial_metadata(self):
        self._await_answer()
        if self._done.is_set() and self._error is not None:
            return self._error.initial_metadata()
        return self._attempt.initial_metadata()


def blocking_call(call: HedgedCall, with_call: bool):
    """A blocking unary-response call over a hedged call: its result, or its error raised."""
    call._done.wait()
    if call._error is not None:
        raise call._error
    return (call._response, call) if with_call else call._response

