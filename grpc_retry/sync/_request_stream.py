"""A blocking stream-unary call without hedging (grpcio's `__call__` and `with_call`): one attempt at a time, each
grpcio's own blocking call, made and waited for on the caller's thread as grpcio's blocking call is.

Two threads take part, as in grpcio's: the caller's, which starts each attempt, takes its events and tells the
machine its status, and, for each attempt, a thread sending the attempt's requests (a worker of the channel's,
kept for the next attempt, where grpcio starts a thread per call) — here, what the machine writes to that
attempt, the application's next message pulled by that thread itself once the attempt has sent all it was
given. Both decide under the call's one lock and act outside it (an attempt's cancel); only
the caller's thread starts attempts and exports telemetry. The non-blocking call (sync/_nonblocking.py) does the same
with a queue of actions, for any shape and any thread; this is its one-attempt-at-a-time, two-thread case, at a
fraction of its cost per call.
"""

from __future__ import annotations

import collections
import threading
from time import monotonic
from typing import TYPE_CHECKING, Any, Deque, Iterator, List, Optional, Tuple

import grpc

from grpc_retry._core import CANCEL, DELIVER, END, HALF_CLOSE, START, TIMER, UNWAIT, WAIT, WRITE, CallMachine
from grpc_retry._driver import CANCELLED_DETAILS, CLOSED_DETAILS, INF, log
from grpc_retry._transport import transport as internals
from grpc_retry._waiters import Waiters
from grpc_retry.sync._attempts import _Attempts, requests_of

if TYPE_CHECKING:
    from grpc_retry._core import Action
    from grpc_retry._transport.protocol import OwnSyncAttempts

_OK = grpc.StatusCode.OK
_CLOSE = object()  # in an attempt's outbox: no more messages for it


class BlockingStreamCall(_Attempts):
    """Run by its caller's thread (run()); each attempt's requests are iterated by the thread sending them."""

    __slots__ = ("_lock", "_changed", "_requests", "_serializer", "_pulling", "_exhausted", "_current", "_outbox",
                 "_attempt", "_next", "_timer_at", "_generation", "_wake", "_ending", "_delivered", "_end_code",
                 "_last", "_local_details", "_refusal", "_own")

    def __init__(self, method: Any, machine: CallMachine, own: OwnSyncAttempts, request_iterator: Any,
                 serializer: Any, metadata: Any, credentials: Any, wait_for_ready: Optional[bool],
                 compression: Any) -> None:
        self._init_attempts(method, machine, None, metadata, credentials, wait_for_ready, compression, True)
        self._own = own  # the transport's own attempts: a blocking stream-unary one each
        self._lock = threading.Lock()
        self._changed = Waiters(self._lock)  # an attempt's request iterator waits for a message another pulls
        self._requests = requests_of(request_iterator)
        self._serializer = serializer
        self._pulling = False    # a thread is in the application's iterator
        self._exhausted = False  # ... which has ended (or failed)
        self._current = -1       # the attempt the machine counts live (at most one), from its START
        self._outbox: Deque[Any] = collections.deque()  # what the machine wrote to it, not yet taken
        self._attempt: Any = None  # its grpcio call, while the caller's thread runs it
        self._next: Optional[Tuple[int, int, int]] = None  # a START for the caller's thread
        self._timer_at = INF
        self._generation = -1      # waiting for a subchannel after this generation
        self._wake: Optional[threading.Event] = None  # set when the caller's thread, waiting, has more to do
        self._ending = False
        self._delivered = -1       # DELIVER's attempt
        self._end_code = -1        # END's code
        self._last: Any = None     # (the attempt's ended call, its response) of the status told last
        self._local_details = CANCELLED_DETAILS
        self._refusal: Optional[Exception] = None

    def run(self, with_call: bool) -> Any:
        calls = self._method.calls
        calls.add(self)
        try:
            self._run()
        except BaseException:  # interrupted: the call is cancelled, as grpcio's blocking call cancels its own
            self._fail(grpc.StatusCode.CANCELLED, CANCELLED_DETAILS)
            raise
        finally:
            calls.discard(self)
            if self._obs is not None:
                self._obs.flush()  # the end, when the request iterator's thread decided it
        if self._refusal is not None:  # grpcio refused the first attempt (metadata it cannot send): as grpcio,
            raise self._refusal        # the call site raises
        if self._delivered >= 0:
            call, response = self._last
            self._outcome(call, self._machine.previous(self._delivered), response)
        else:
            self._local(self._end_code, self._local_details)
        if self._error is not None:
            raise self._error
        return (self._response, self._final) if with_call else self._response

    def close_channel(self) -> None:
        """The channel is closing: the subchannels' close ends an attempt in flight, and a wait for backoff or
        for a subchannel (see _run)."""

    def closed(self, timeout: float) -> None:
        pass

    # -- the caller's thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        machine, lock = self._machine, self._lock
        subchannels = self._method.subchannels
        with lock:
            cancels = self._decide(machine.start(monotonic(), None))
        while True:
            if self._obs is not None:
                self._obs.flush()  # what the machine decided, exported before what it decided is done
            if cancels:
                _cancel(cancels)
            with lock:
                if self._ending:
                    return
                due, self._next = self._next, None
                if due is None:
                    wake = self._wake = threading.Event()
                    timer_at, generation = self._timer_at, self._generation
            if due is not None:
                cancels = self._attempt_of(*due)
                continue
            # Backoff, or no subchannel to take the attempt: until the timer, a change, the end or the close.
            subchannels.wait_change(None if timer_at == INF else max(timer_at - monotonic(), 0.0),
                                    generation if generation >= 0 else None, wake)
            with lock:
                self._wake = None
                if self._ending:
                    cancels = None
                elif self._method.closed():
                    self._local_details = CLOSED_DETAILS
                    cancels = self._decide(machine.cancel(grpc.StatusCode.CANCELLED.value[0], monotonic()))
                elif self._generation >= 0 and subchannels.generation != self._generation:
                    self._generation = -1
                    cancels = self._decide(machine.subchannels_changed(monotonic()))
                elif monotonic() >= self._timer_at:
                    self._timer_at = INF
                    cancels = self._decide(machine.timer(monotonic()))
                else:
                    cancels = None

    def _attempt_of(self, n: int, address: int, previous: int) -> Optional[List[Any]]:
        """Make attempt n and run it to its end; its status to the machine."""
        lock = self._lock
        try:
            inner = self._method.inner(address)
            kwargs = self._kwargs(n, address, previous)
            with lock:  # made and known at once: a cancel meanwhile finds it
                if self._current != n:
                    return None  # cancelled before it was made
                attempt = self._attempt = self._own.blocking_request_stream(
                    inner, self._attempt_requests(n, self._outbox), **kwargs)
        except Exception as error:  # the channel closed meanwhile, or grpcio refused the call
            return self._not_started(error)
        self._method.attempt_started(address)
        ended = attempt.run(self._method.workers)
        with lock:
            self._attempt = None
            if self._current != n:
                return None  # the machine cancelled it meanwhile: the call is ending
            self._current = -1
            self._changed.notify_all()  # its request iterator, if it waits, is over
            code, details, trailing, _, initial = internals.sync_status(ended)
            response = internals.sync_response(ended) if code is _OK else None
            self._last = ended, response
            return self._decide(self._machine.status(n, 0 if code is _OK else code.value[0], details, trailing,
                                                     monotonic(), bool(initial), response is not None))

    def _not_started(self, error: Exception) -> Optional[List[Any]]:
        with self._lock:
            if self._ending:
                return None
            if self._method.closed():
                self._local_details = CLOSED_DETAILS
                code = grpc.StatusCode.CANCELLED
            else:
                log.debug("grpc_retry could not start an attempt: %r", error)
                self._refusal = error
                self._local_details = f"grpc_retry could not start an attempt: {error!r}"
                code = grpc.StatusCode.INTERNAL
            return self._decide(self._machine.cancel(code.value[0], monotonic()))

    # -- decisions (under the lock, on either thread) -----------------------------------------------------------

    def _decide(self, actions: List[Action]) -> Optional[List[Any]]:
        """Take what the machine decided: writes go to the attempt's outbox, a START to the caller's thread; the
        grpcio calls to cancel (outside the lock) are returned."""
        cancels = None
        wake = False
        for action in actions:
            kind = action[0]
            if kind == WRITE or kind == HALF_CLOSE:
                if action[1] == self._current:
                    self._outbox.append(action[3] if kind == WRITE else _CLOSE)
                    self._changed.notify_all()
            elif kind == START:
                self._next = (action[1], action[2], action[3])
                self._current = action[1]
                self._outbox = collections.deque()
                wake = True
            elif kind == CANCEL:
                if action[1] == self._current:
                    self._current = -1
                    self._changed.notify_all()
                    if self._attempt is not None:
                        cancels = [self._attempt]
            elif kind == TIMER:
                self._timer_at = action[1]
                wake = True
            elif kind == WAIT:
                self._generation = action[1]
            elif kind == UNWAIT:
                self._generation = -1
            elif kind == DELIVER or kind == END:
                self._ending = True
                if kind == DELIVER:
                    self._delivered = action[1]
                else:
                    self._end_code = action[1]
                wake = True
            # COMMIT: nothing to do, the one attempt carries the call
        if wake and self._wake is not None:
            self._wake.set()
        return cancels

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        with self._lock:
            if self._ending:
                return
            self._local_details = details
            cancels = self._decide(self._machine.cancel(code.value[0], monotonic()))
        if cancels:
            _cancel(cancels)

    # -- an attempt's requests (the thread sending them) ----------------------------------------------------------

    def _attempt_requests(self, n: int, outbox: Deque[Any]) -> Iterator[bytes]:
        """What the machine writes to attempt n; when it has sent all it was given, the application's next
        message, pulled here (unless another attempt's thread is at it)."""
        lock, machine = self._lock, self._machine
        wrote = False
        while True:
            cancels = None
            with lock:
                if wrote and self._current == n:
                    cancels = self._decide(machine.wrote(n, monotonic()))
                while True:
                    if self._current != n:
                        item = _CLOSE
                        break
                    if outbox:
                        item = outbox.popleft()
                        break
                    if not self._pulling and not self._exhausted and machine.wants_message(n):
                        self._pulling = True
                        item = None
                        break
                    self._changed.wait()
            if cancels:  # (writes cancel nothing today; whatever the machine decides is acted on)
                _cancel(cancels)
            if item is None:
                self._pull()
                wrote = False
                continue
            if item is _CLOSE:
                return
            wrote = True
            yield item  # type: ignore[misc]  # (a request's bytes; not typing.cast(): a Python call, compiled)

    def _pull(self) -> None:
        """The application's next message, to the machine (which buffers it for the attempts to come)."""
        failed: Optional[Tuple[grpc.StatusCode, str]] = None
        data: Optional[bytes] = None
        try:
            request = next(self._requests)
        except StopIteration:
            pass
        except Exception:
            log.exception("request iterator failed")
            failed = grpc.StatusCode.UNKNOWN, "Exception iterating requests!"
        else:
            try:
                data = request if self._serializer is None else self._serializer(request)
            except Exception:
                log.exception("request serializer failed")
                failed = grpc.StatusCode.INTERNAL, "Exception serializing request!"
        cancels = None
        with self._lock:
            self._pulling = False
            self._changed.notify_all()  # an attempt's thread waiting for this message
            if failed is not None or data is None:
                self._exhausted = True
            if failed is None and not self._ending:
                if data is None:
                    cancels = self._decide(self._machine.half_close(monotonic()))
                else:
                    cancels = self._decide(self._machine.send_message(data, monotonic()))
        if cancels:
            _cancel(cancels)
        if failed is not None:
            self._fail(*failed)


def _cancel(attempts: List[Any]) -> None:
    for attempt in attempts:
        attempt.cancel()
