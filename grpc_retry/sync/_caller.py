"""A blocking sync call's caller (`_Caller`, under Call in sync/_call.py): its thread does the call's work while
it can, as grpcio's own blocking call waits on its own call. It makes each attempt the machine starts while the
thread is free and runs it to its end — a unary exchange as one batch, an attempt that shows its headers first
polled on its own queue, a stream-unary attempt whose requests a worker of the channel's sends — and keeps the
machine's timer while no attempt it does not run is out. What it cannot do at once goes on as for any call of the
driver (sync/_driver.py): a hedge made while it polls another attempt reports from grpcio's spin thread, a timer
due then fires on the timer thread, a subchannel's change comes from its listener; each START decided while the
thread is free becomes its next attempt, whichever thread decided it."""

from __future__ import annotations

from functools import partial
from threading import get_ident
from time import monotonic
from typing import TYPE_CHECKING, Any, List

import grpc

from grpc_retry._driver import CANCELLED_DETAILS, DEADLINE_DETAILS, INF, grpc_details, log
from grpc_retry._transport import transport as internals
from grpc_retry.sync._driver import EXCHANGE, LOST_END_DETAILS, POLLED, _Driver
from grpc_retry.sync._status import FinishedCall

if TYPE_CHECKING:
    from grpc_retry._core import Action

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED


class _Caller(_Driver):
    """The caller's thread of a blocking call (an extension type, sync/_caller.pxd)."""

    def run(self, with_call: bool) -> Any:
        """(A blocking call's caller.) Start the call, make and run each attempt the machine starts while this
        thread is free, keep the machine's timer while nothing else is out, until the call ends; then its result
        (`with_call`: and an ended call, as grpcio's with_call()). Interrupted (a signal's exception), the call is
        cancelled, and the exception goes on."""
        self._with_call = with_call
        self._thread = get_ident()
        try:
            self._begin()
            self._serve()
        except BaseException:
            self._abandon()
            raise
        if self._refusal is not None:  # grpcio refused the first attempt (metadata it cannot send): as grpcio,
            raise self._refusal        # the call site raises
        if self._error is not None:
            raise self._error
        response = self._response
        if not with_call:
            return response
        final = self._final
        if self._kind == POLLED and not isinstance(final, FinishedCall):
            final = FinishedCall(final, final.trailing_metadata(), response)
        return response, final

    def _serve(self) -> None:
        lock = self._lock
        while True:
            if self._finished:
                return  # (an attempt it had yet to make was cancelled with the call)
            job = self._job
            if job is not None:  # (set by this thread, or by another under the lock: see _start)
                self._busy = True  # (first: from now on a START another thread performs does not wait for it)
                self._job = None
                self._run_job(job[0], job[1], job[2])
                continue
            lock.acquire()  # (not `with`, on the call's path: compiled, a `with` binds two of the lock's methods)
            try:
                token = -1
                while self._job is None and not self._finished:
                    kept = self._kept_at
                    if kept == INF:
                        self._changed.wait()
                        continue
                    left = kept - monotonic()
                    if left > 0:
                        self._changed.wait(left)
                    elif self._kept_token == self._timer_token:
                        token = self._kept_token
                        self._kept_at = INF
                        break
                    else:
                        self._kept_at = INF
                job, self._job = self._job, None
                if self._finished:
                    job = None
                elif job is not None:
                    self._busy = True
            finally:
                lock.release()
            if job is not None:
                self._run_job(job[0], job[1], job[2])
            elif token >= 0:  # its timer, due
                self._lock.acquire()
                self._fire(token)
            else:
                return

    def _abandon(self) -> None:
        """The blocking caller has gone (interrupted): the call is cancelled; an attempt that was for its thread
        to make goes with it."""
        with self._lock:
            self._caller = False
            self._job = None
            self._kept_at = INF
        self._fail(grpc.StatusCode.CANCELLED, CANCELLED_DETAILS)

    # -- the attempts it makes and runs -----------------------------------------------------------------------------

    def _run_job(self, n: int, address: int, previous: int) -> None:
        """Make attempt n as the caller's thread makes it (`_kind`), run it to its end, and tell the machine."""
        try:
            inner = self._method.inner(address)
            if self._kind == EXCHANGE:
                self._exchange(n, address, previous, inner)
            elif self._kind == POLLED:
                self._polled(n, address, previous, inner)
            else:
                self._streamed(n, address, previous, inner)
        except Exception as error:  # the channel closed meanwhile, or grpcio refused the call
            with self._lock:
                self._busy = False
            self._not_started(error)

    def _exchange(self, n: int, address: int, previous: int, inner: Any) -> None:
        """A unary exchange, as grpcio's blocking call. A timer the caller keeps (an attempt's
        perAttemptRecvTimeout, while the method's server is seen sending headers with its responses:
        Method.first_whole) is its deadline, when that comes before the call's: it ends DEADLINE_EXCEEDED then."""
        method = self._method
        at = self._machine.deadline
        timer_at = self._kept_at
        if timer_at < at:
            at = timer_at
        request = self._request
        assert request is not None  # (not typing.cast(): compiled, that is still a Python function's call)
        method.attempt_started(address)
        call, response, ok = internals.sync_exchange(
            inner.multicallable, request, None if at == INF else at - monotonic(), self._attempt_metadata(n, previous),
            self._credentials, self._grpc_wfr, self._compression, self._with_call)
        self._lock.acquire()
        self._busy = False
        if self._ending or n not in self._live:
            self._lock.release()
            return
        try:
            decided = self._exchanged(n, call, response, ok, timer_at)
        except Exception:  # a bug: end the call, not leave it
            decided = self._broken()
        self._told(decided)

    def _exchanged(self, n: int, call: Any, response: Any, ok: bool, timer_at: float) -> List[Action]:
        """(Under the lock.) An exchange's end, for the machine: its status, or its timer's firing."""
        if ok:
            self._live.discard(n)
            self._last = call, response
            return self._machine.status(n, 0, None, None, monotonic())
        code, details, trailing, _, initial = internals.sync_status(call)
        if (code is _DEADLINE_EXCEEDED and timer_at < self._machine.deadline
                and grpc_details(details, False) == DEADLINE_DETAILS):
            # Its perAttemptRecvTimeout (the machine cancels it as its timer fires, and judges headers seen)
            if self._kept_token == self._timer_token:
                self._kept_at = INF
            return self._machine.exchange_timer(max(monotonic(), timer_at), bool(initial))
        self._live.discard(n)
        self._last = call, None
        return self._machine.status(n, code.value[0], details, trailing, monotonic(), bool(initial))

    def _polled(self, n: int, address: int, previous: int, inner: Any) -> None:
        """A unary attempt that shows its headers first, polled on this thread as grpcio's blocking call waits
        for its own: its events are told here. The first of a hedged call is one batch while its method's server
        is seen sending headers with its responses (Method.first_whole)."""
        method = self._method
        call = inner.polled(self._request, self._timeout(), self._attempt_metadata(n, previous), self._credentials,
                            self._grpc_wfr, self._compression, partial(self._headers_came, n),
                            partial(self._headers_first_ended, n), n == 0 and self._hedged and method.first_whole())
        method.attempt_started(address)
        with self._lock:
            live = n in self._live
            if live or not call.done():
                self._attempts[n] = call
            if not call.polled:  # (the portable transport's one batch: grpcio's thread tells its end)
                self._busy = False
                return
        if not live:
            call.cancel()  # cancelled while it was made: polled to its end all the same
        call.poll()
        with self._lock:
            self._busy = False
            lost = n in self._live and self._attempts.get(n) is call and not self._ending
        if lost:  # its end was told on this thread: the machine should have had it (a bug)
            log.error("grpc_retry: a blocking call's end was lost; it ends INTERNAL")
            self._fail(grpc.StatusCode.INTERNAL, LOST_END_DETAILS)

    def _streamed(self, n: int, address: int, previous: int, inner: Any) -> None:
        """A stream-unary attempt, run as grpcio's blocking call: its requests are what the machine writes to it
        (the transport sends them from a worker of the channel's where it can: grpcio starts a thread per call)."""
        method = self._method
        kwargs = self._kwargs(n, address, previous)
        with self._lock:  # made and known at once: a cancel meanwhile finds it
            if n not in self._live:
                self._busy = False
                return  # cancelled before it was made
            attempt = inner.blocking(self._attempt_requests(n), **kwargs)
            self._attempts[n] = attempt
        method.attempt_started(address)
        ended = attempt.run(method.workers)
        with self._lock:
            self._busy = False
        self._ended(n, ended)

