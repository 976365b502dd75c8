"""The synchronous driver: grpc's sync call objects over the call machine, whose attempts are plain grpc sync
calls on subchannels, carrying bytes.

One lock per call: events are decided under it, and the actions they bring are performed outside it, in order,
by whichever thread brought them (grpc-java's RetriableStream shape). A blocking unary call runs its attempts
inline on the caller's thread, and so does a blocking stream-unary call (sync/_request_stream.py). Futures and
response iterators progress on grpc's done callbacks, the shared timer thread and subchannel listeners; nothing
here ever calls a grpcio method that can block from grpcio's own thread (an ended attempt's status is read from
its state). A hedged unary attempt reports its headers and its end from grpcio's spin thread
(internals.SyncHeadersFirst), or, in a blocking call, from the caller's thread, which polls it as it waits
(polled_result); another hedge's first answer needs a blocking read, so it is watched from one of its channel's
worker threads until it answers or ends; whoever reads a response stream reads the attempt. Closing the channel
ends every call: through the subchannels' close, as grpcio's close ends its own calls, for attempts in flight;
with grpcio's "Channel closed!" for calls in backoff or waiting.
"""

from __future__ import annotations

import collections
import threading
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple, Type, TypeVar, cast

import grpc

from grpc_retry._core import CANCEL, DELIVER, END, START, TIMER, UNWAIT, WAIT, CallMachine
from grpc_retry._transport import transport as internals

if TYPE_CHECKING:
    from grpc_retry._core import Action  # (kind, attempt, argument): an action the machine decided

from grpc_retry import _driver as driver
from grpc_retry._driver import (
    CANCELLED_DETAILS,
    CLOSED_DETAILS,
    DEADLINE_DETAILS,
    INF,
    CallDriver,
    grpc_details,
    local_status,
    log,
)
from grpc_retry._driver import trailing_with_attempts as trailing_of
from grpc_retry._method import DESERIALIZE_FAILED, EARLY_HEADERS, UNDESERIALIZABLE
from grpc_retry._timer import TIMERS
from grpc_retry._waiters import Waiters
from grpc_retry.sync._status import FinishedCall, RpcError, local_error, traceback_of

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED
_EOF = object()
_HALF_CLOSE = object()
# As the asyncio driver: silence this long after empty response headers means they were real headers, not a
# Trailers-Only response whose status is a moment behind.
HEADERS_GRACE = 0.05


class _Attempts(CallDriver):
    """How a call starts attempts and tells what ended it: shared by the blocking and the non-blocking call."""

    __slots__ = ("_error", "_response", "_final")

    def _init_attempts(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any,
                       credentials: Any, wait_for_ready: Optional[bool], compression: Any,
                       stream_request: bool) -> None:
        """What its subclasses' constructors do first (see CallDriver._init_driver)."""
        self._init_driver(method, machine, request, metadata, credentials, wait_for_ready, compression,
                          stream_request)
        self._error: Optional[RpcError] = None
        self._response: Any = None
        self._final: Any = None   # with OK: the attempt whose result the application gets

    def _same_call(self, other: CallDriver) -> None:
        super()._same_call(other)
        self._error = None
        self._response = None
        self._final = None

    def _kwargs(self, n: int, address: int, previous: int) -> Dict[str, Any]:
        return dict(timeout=self._timeout(), metadata=self._attempt_metadata(n, previous),
                    credentials=self._credentials, wait_for_ready=self._grpc_wfr, compression=self._compression)

    def _timeout(self) -> Optional[float]:
        """An attempt's timeout: what is left of the call's deadline (None: no deadline)."""
        deadline = self._machine.deadline
        return None if deadline == INF else deadline - monotonic()

    def _outcome(self, call: Any, previous: int, response: Any, delivered: bool = False) -> None:
        """The call ends with ended attempt `call`'s result (None: it succeeded, and only its response is wanted).
        `delivered`: a response message of it reached the application."""
        trailing = None
        if call is not None and (previous > 0 or internals.sync_code(call) is not _OK):
            code, details, trailing, debug, initial = internals.sync_status(call)
            if previous > 0:
                trailing = trailing_of(trailing, previous)
            if code is not _OK:
                self._error = RpcError(code, grpc_details(details, delivered or bool(initial)), initial, trailing,
                                       debug)
                return
        if response is not None and self._method.deserializer is not None:
            response = self._method.deserialize(response)
            if response is UNDESERIALIZABLE:
                self._error = local_error(grpc.StatusCode.INTERNAL, DESERIALIZE_FAILED)
                return
        self._response = response
        if trailing is not None and previous > 0:
            self._final = FinishedCall(call, trailing, response)
        elif call is not None and (response is not None and self._method.deserializer is not None
                                   or internals.FINAL_WRAPPED):
            self._final = internals.sync_final(call, response)  # its result(), as grpcio's: the response, deserialized
        else:
            self._final = call

    def _local(self, code: int, details: str) -> None:
        self._error = local_error(*local_status(code, details, self._method.subchannels, self._machine))


class BlockingCall(_Attempts):
    """A unary-unary call with no hedging, run inline on the caller's thread: each attempt is grpcio's own
    blocking call; backoff and waits for a subchannel block this thread too.

    An attempt timed by perAttemptRecvTimeout is one batch here only while its method's server is seen sending
    headers with its responses (Method.first_whole): it has not answered before its response, so its timer is its
    grpcio deadline, and a local deadline before the call's is its timer firing."""

    __slots__ = ("_next", "_timer_at", "_generation", "_ended", "_last", "_local_details", "_with_call")

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> None:
        self._init_attempts(method, machine, request, metadata, credentials, wait_for_ready, compression, False)
        self._next: Optional[Tuple[Any, ...]] = None
        self._timer_at = INF
        self._generation = -1
        self._ended = False
        self._last: Any = None
        self._local_details = CANCELLED_DETAILS

    def run(self, with_call: bool) -> Any:
        self._with_call = with_call
        calls = self._method.calls
        calls.add(self)
        try:
            return self._run()
        finally:
            calls.discard(self)

    def close_channel(self) -> None:
        """The channel is closing: an attempt in a blocking grpcio call ends with the subchannel's close, a wait
        for backoff or for a subchannel by itself, on the caller's thread."""

    def closed(self, timeout: float) -> None:
        pass

    def _run(self) -> Any:
        machine = self._machine
        subchannels = self._method.subchannels
        actions = machine.start(monotonic(), self._request)
        while True:
            self._act(actions)
            if self._ended:
                break
            if self._next is not None:
                actions = self._attempt(*self._next)
                continue
            now = monotonic()
            subchannels.wait_change(None if self._timer_at == INF else max(self._timer_at - now, 0.0),
                                    self._generation if self._generation >= 0 else None)
            if self._method.closed():
                self._local_details = CLOSED_DETAILS
                actions = machine.cancel(1, monotonic())
            elif self._generation >= 0 and subchannels.generation != self._generation:
                self._generation = -1
                actions = machine.subchannels_changed(monotonic())
            elif monotonic() >= self._timer_at:
                self._timer_at = INF
                actions = machine.timer(monotonic())
            else:
                actions = []
        if self._error is not None:
            raise self._error
        return (self._response, self._final) if self._with_call else self._response

    def _attempt(self, n: int, address: int, previous: int) -> List[Action]:
        self._next = None
        inner = self._method.inner(address)
        if self._method.headers_first:  # (a timed call's method: its attempts' shape shows headers first)
            inner = inner.multicallable
        try:
            if self._with_call:
                self._method.attempt_started(address)  # (grpcio's blocking call: no moment between is ours)
                response, call = inner.with_call(self._request, **self._kwargs(n, address, previous))
            elif internals.sync_direct():  # no call object wanted: the exchange on grpcio's Cython call
                request = self._request
                assert request is not None  # (not typing.cast(): compiled, that is still a Python function's call)
                started, receiving = internals.sync_unary_start(
                    inner, request, self._timeout(), self._attempt_metadata(n, previous), self._credentials,
                    self._grpc_wfr, self._compression)
                self._method.attempt_started(address)
                ended = internals.sync_unary_end(started, receiving)
                state = ended._state
                code = state.code
                assert code is not None
                if code is not _OK:
                    if code is _DEADLINE_EXCEEDED and self._timed_out(state.details, state.initial_metadata):
                        return self._machine.timer(max(monotonic(), self._timer_at))
                    self._last = ended, None
                    return self._machine.status(n, code.value[0], state.details, state.trailing_metadata,
                                                monotonic(), bool(state.initial_metadata))
                response, call = state.response, None
            else:  # grpcio's observability plugin records its own blocking calls: grpcio's, then
                self._method.attempt_started(address)
                response, call = inner(self._request, **self._kwargs(n, address, previous)), None
        except grpc.RpcError as error:
            code, details, trailing, _, initial = internals.sync_status(error)
            if code is _DEADLINE_EXCEEDED and self._timed_out(details, initial):
                return self._machine.timer(max(monotonic(), self._timer_at))
            self._last = error, None
            return self._machine.status(n, code.value[0], details, trailing, monotonic(), bool(initial))
        self._last = call, response
        return self._machine.status(n, 0, None, None, monotonic())

    def _timeout(self) -> Optional[float]:
        """An attempt's timeout: what is left of the call's deadline, or of the attempt's perAttemptRecvTimeout
        (the machine's timer while an attempt is out) when that comes first."""
        at = self._machine.deadline
        if self._timer_at < at:
            at = self._timer_at
        return None if at == INF else at - monotonic()

    def _timed_out(self, details: Any, initial: Any) -> bool:
        """Whether an attempt that ended DEADLINE_EXCEEDED ended at its perAttemptRecvTimeout (its deadline
        here, by grpcio's own timer, before the call's). Headers seen with it mean the server sends them ahead of
        its response: the method's attempts show them first from then on."""
        if self._timer_at >= self._machine.deadline or grpc_details(details, False) != DEADLINE_DETAILS:
            return False
        if initial:
            self._method.headers_early()
        return True

    def _start(self, n: int, address: int, previous: int) -> None:
        self._next = (n, address, previous)

    def _arm(self, at: float) -> None:
        self._timer_at = at

    def _wait(self, generation: int) -> None:
        self._generation = generation

    def _unwait(self) -> None:
        self._generation = -1

    def _deliver(self, n: int) -> None:
        call, response = self._last
        self._outcome(call, self._machine.previous(n), response)
        self._ended = True

    def _end(self, code: int) -> None:
        self._local(code, self._local_details)
        self._ended = True

    def _write(self, n: int, data: bytes) -> None:  # a unary request goes with its attempt
        pass

    def _half_close(self, n: int) -> None:
        pass

    def _commit(self, n: int) -> None:
        pass

    def _cancel_attempt(self, n: int) -> None:  # never: the one attempt has ended whenever the machine decides
        pass


_C = TypeVar("_C", bound="_NonBlocking")


class _NonBlocking(_Attempts):
    """A non-blocking call's state and work (an extension type, sync/_call.pxd); Call adds grpcio's abstract
    classes over it."""

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], request_iterator: Any,
                 serializer: Any, metadata: Any, credentials: Any, wait_for_ready: Optional[bool],
                 compression: Any, polled: bool = False, inline: Any = None) -> None:
        if inline is None:
            self._init_attempts(method, machine, request, metadata, credentials, wait_for_ready, compression,
                                request_iterator is not None)
        else:  # a call handed over by its inline driver (see adopting): what the attempts are started with
            self._same_call(inline)
        self._lock = threading.Lock()
        # A blocking hedged unary call: its caller's thread, waiting for the end (polled_result), drives one
        # attempt at a time on that attempt's own queue, as grpcio's blocking call does; other attempts report
        # from grpcio's spin thread. `_poller`: an attempt is made (or being made) for it, and not yet polled.
        self._polled = polled
        self._blocking = polled  # nothing sees the call before it ends: see _headers_came
        self._poller = False
        self._unpolled: Any = None
        self._changed = Waiters(self._lock)  # an attempt started, ended or won; the call ended
        self._queue: Deque[Action] = collections.deque()   # decided, not yet performed
        self._draining = False
        self._hedged = machine.hedging
        self._watched = machine.watched  # hedged, or timed per attempt: each attempt's first answer is watched
        self._live: Set[int] = set()          # attempts the machine counts as live
        self._attempts: Dict[int, Any] = {}   # their grpcio calls, once started
        self._last: Any = None                # the attempt whose status the machine heard last, and its response
        self._responses: Dict[int, Any] = {}  # hedges of a unary call: a response read by the watcher
        self._current = -1                    # the attempt in flight (not hedged): the one a reader reads ahead
        self._peek: Any = None                # (n, first message of n), read before n won
        self._reads: Set[int] = set()         # attempts whose first message is being read before they won
        self._deferred: Dict[int, Any] = {}   # ... and which ended meanwhile: their end waits for that read
        self._graces: Dict[int, Any] = {}     # hedges with empty headers: their silence commits after this timer
        self._silent: Optional[Tuple[int, float]] = None  # (n, since): the same, without a timer (_headers_came)
        self._heard: Optional[Tuple[int, float]] = None  # (n, when) its headers with metadata came (_headers_came)
        self._timer: Any = None
        # Bumped as each TIMER (WAIT, UNWAIT) is decided: a timer (listener) armed for an earlier one is stale.
        # The actions are performed later, in order: each takes the token of its own decision from `_tokens`.
        self._timer_token = 0
        self._wait_token = 0
        self._tokens: Deque[int] = collections.deque()
        self._listener: Optional[Callable[[], None]] = None
        self._ending = False                  # the machine has decided the end
        self._finished = False  # set (under the lock) as the call ends; _changed tells it
        self._local_details = CANCELLED_DETAILS
        self._delivered = False               # a response message reached the application
        self._call_callbacks: List[Callable[[], None]] = []
        self._done_callbacks: List[Callable[[Any], None]] = []
        self._calls = method.calls
        # request streams
        self._requests: Any = None if request_iterator is None else _requests_of(request_iterator)
        self._serializer = serializer
        self._outboxes: Dict[int, Deque[Any]] = {}
        self._pulling = False
        self._exhausted = request_iterator is None
        self._calls.add(self)
        self._refusal: Optional[Exception] = None
        if inline is not None:
            return
        self._event(lambda: machine.start(monotonic(), request))
        if self._refusal is not None:  # grpcio refused the first attempt (metadata it cannot send): as grpcio,
            raise self._refusal        # the call site raises (the call has ended, INTERNAL)

    @classmethod
    def adopting(cls: Type[_C], inline: Any, actions: List[Action], attempt: Any, timer_at: float,
                 silent: float) -> _C:
        """(Under `inline`'s lock.) A blocking hedged call that its inline driver (sync/_hedged.py) hands over,
        with its machine's state: attempt 0 if still out (`attempt`; its caller's thread may be polling it), the
        timer the machine has armed (`timer_at`), when attempt 0's empty headers came (`silent`, -1: not), and
        `actions`, what the machine has just decided. The caller must then _drain() it (outside its lock)."""
        call = cls(inline._method, inline._machine, inline._request, None, None, None, None, None, None, True,
                   inline)
        with call._lock:
            if attempt is not None:
                call._live.add(0)
                call._attempts[0] = attempt
                call._poller = attempt.polled
                if silent >= 0:
                    call._graces[0] = call._grace(0, max(0.0, silent + HEADERS_GRACE - monotonic()))
            if timer_at != INF:
                actions = [(TIMER, timer_at)] + actions
            call._note(actions)
            call._claim_drain()
        return call

    # -- events: decided under the lock, performed outside it --------------------------------------------------

    def _event(self, decide: Callable[[], List[Action]], n: int = -1) -> None:
        """Feed an event to the machine (`decide`, called under the lock), then perform what it decided, in
        order, unless a thread is already at it. An event of attempt n (>= 0) is dropped once the machine no
        longer counts n as live (cancelled, or its end already told)."""
        with self._lock:
            if self._ending or n >= 0 and n not in self._live:
                return
            try:
                decided = decide()
            except Exception:  # a bug (the event runs on a timer's or grpcio's thread): end the call, not leave it
                self._local_details = driver.INTERNAL_DETAILS
                decided = driver.broken(self._live)
            self._note(decided)
            if not self._claim_drain():
                return
            actions = list(self._queue)  # (taken here: one lock round less per event)
            self._queue.clear()
        self._drain(actions)

    def _claim_drain(self) -> bool:
        """(Under the lock.) Whether this thread performs the queued actions (no other thread is at it)."""
        if self._draining:
            return False
        self._draining = True
        return True

    def _note(self, actions: List[Action]) -> None:
        """What later events are checked against, noted as the machine decides (under the lock)."""
        for action in actions:
            kind = action[0]
            if kind == START:
                self._live.add(action[1])
            elif kind == CANCEL:
                self._live.discard(action[1])
            elif kind == TIMER:
                self._timer_token += 1
                self._tokens.append(self._timer_token)
            elif kind == WAIT:
                self._wait_token += 1
                self._tokens.append(self._wait_token)
            elif kind == UNWAIT:
                self._wait_token += 1
            elif kind == DELIVER or kind == END:
                self._ending = True
        self._queue.extend(actions)

    def _drain(self, actions: Optional[List[Action]] = None) -> None:
        """(The thread that claimed the drain.) Perform `actions` (taken off the queue already), then what is
        queued, until nothing is."""
        queue = self._queue
        while True:
            if actions is None:
                with self._lock:  # what is queued so far, taken at once (each is performed in order)
                    if not queue:
                        self._draining = False
                        return
                    actions = list(queue)
                    queue.clear()
            if self._obs is not None:
                self._obs.flush()  # what the machine decided to get these actions, exported first
            for action in actions:
                try:
                    self._perform(action)
                except Exception:  # a bug: end the call rather than leave it, and this queue, stuck
                    log.exception("grpc_retry could not perform %r", action)
                    self._fail(grpc.StatusCode.INTERNAL, driver.INTERNAL_DETAILS)
            actions = None

    # -- actions (performed in order, outside the lock) ---------------------------------------------------------

    def _start(self, n: int, address: int, previous: int) -> None:
        with self._lock:
            if n not in self._live:
                return  # cancelled before it started
            if self._requests is not None:
                self._outboxes[n] = collections.deque()
            pollable = self._polled and not self._poller
            if pollable:
                self._poller = True
        method = self._method
        try:
            inner = method.inner(address)
            kwargs = self._kwargs(n, address, previous)
            payload = self._request if self._requests is None else self._attempt_requests(n)
            reports = method.reports_end  # the attempt reports its end itself (else: grpcio's callback)
            if method.headers_first:  # a hedged unary attempt that reports itself (see polled_result)
                call = inner(payload, on_headers=partial(self._headers_came, n),
                             on_end=partial(self._headers_first_ended, n), pollable=pollable, **kwargs)
            elif reports:  # a response stream's attempt that reports its end (grpcio's spin thread)
                call = inner(payload, on_end=partial(self._ended, n), **kwargs)
            elif (self._requests is None and not method.attempt_streams and not self._watched
                  and internals.sync_direct()):
                # an unhedged unary-unary attempt (a future, or a call through grpcio's interceptors): grpcio's
                # one batch, reported from its spin thread
                call = internals.SyncUnaryAttempt(inner, payload,  # (its bytes)
                                                  on_end=partial(self._ended, n), **kwargs)
                reports = True
            elif self._requests is not None and internals.sync_direct():
                # its requests sent from a worker of the channel's (grpcio starts a thread per call)
                assert payload is not None and not isinstance(payload, bytes)
                call = internals.sync_request_stream(inner, payload, method.workers,
                                                     method.attempt_streams, **kwargs)
            else:
                call = inner(payload, **kwargs) if method.attempt_streams else inner.future(payload, **kwargs)
        except Exception as error:  # the channel closed meanwhile, or grpcio refused the call
            if pollable:
                with self._lock:
                    self._poller = False
                    self._changed.notify_all()
            self._not_started(error)
            return
        method.attempt_started(address)
        elsewhere = False
        with self._lock:
            if pollable:
                if not call.polled:
                    self._poller = False
                elif self._polled:
                    self._unpolled = call
                else:  # the caller has gone meanwhile (interrupted): the attempt is cancelled, and polled elsewhere
                    elsewhere = True
            if n in self._live or not call.done():  # else it ended already, and the machine heard its status
                self._attempts[n] = call
            if not self._watched:
                self._current = n
            self._changed.notify_all()
        if elsewhere:
            _poll_elsewhere(method, call)
        if method.headers_first:
            return
        if self._watched:
            try:
                method.workers.submit(self._watch, n, call)
            except RuntimeError as error:  # the channel closed meanwhile
                self._not_started(error)
                return
            if method.unary_response:
                return  # its watcher reports its end, once it has its response
        if not reports and not call.add_callback(partial(self._ended, n, call)):
            self._ended(n, call)

    def _not_started(self, error: Exception) -> None:
        if self._method.closed():
            self._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
        else:
            log.debug("grpc_retry could not start an attempt: %r", error)  # (raised, or in the status details)
            self._refusal = error
            self._fail(grpc.StatusCode.INTERNAL, f"grpc_retry could not start an attempt: {error!r}")

    def _write(self, n: int, data: bytes) -> None:
        self._to_outbox(n, data)

    def _half_close(self, n: int) -> None:
        self._to_outbox(n, _HALF_CLOSE)

    def _to_outbox(self, n: int, item: Any) -> None:
        with self._lock:
            outbox = self._outboxes.get(n)
            if outbox is not None:
                outbox.append(item)
                self._changed.notify_all()

    def _cancel_attempt(self, n: int) -> None:
        with self._lock:
            call = self._attempts.pop(n, None)
            self._outboxes.pop(n, None)
            self._responses.pop(n, None)
            if self._current == n:
                self._current = -1
            self._changed.notify_all()
        if call is not None:
            call.cancel()

    def _commit(self, n: int) -> None:
        if not self._blocking:
            with self._lock:
                self._changed.notify_all()  # readers waiting for a winner (a blocking call has none)

    def _arm(self, at: float) -> None:
        # Under the call's lock throughout: a timer's cancel() takes no lock, and the timer thread calls back
        # holding none of its own, so scheduling here cannot deadlock with _on_timer.
        with self._lock:
            timer, self._timer = self._timer, None
            token = self._tokens.popleft()
            if timer is not None:
                timer.cancel()
            if at != INF and self._timer_token == token and not self._ending:
                self._timer = TIMERS.schedule(at - monotonic(), partial(self._on_timer, token))

    def _on_timer(self, token: int) -> None:
        with self._lock:
            if self._timer_token != token:
                return
            self._timer = None
        self._event(lambda: self._timer_fired(token))

    def _timer_fired(self, token: int) -> List[Action]:
        """(Under the lock.) The hedging (or backoff) timer fired: a silence due first commits the call (no hedge
        then)."""
        if self._silent is not None:
            actions = self._silence_due(monotonic())
            if actions:
                return actions
        return self._machine.timer(monotonic()) if self._timer_token == token else []

    def _silence_due(self, now: float) -> List[Action]:
        """(Under the lock; a hedge may start now.) The attempt whose empty headers came without a grace timer:
        its silence commits the call if it has lasted HEADERS_GRACE; else it gets its timer now."""
        n, since = cast("Tuple[int, float]", self._silent)
        self._silent = None
        if n not in self._live or self._machine.winner == n:
            return []
        if now - since >= HEADERS_GRACE:
            return self._silence_lasted(n)
        self._graces[n] = self._grace(n, since + HEADERS_GRACE - now)
        return []

    def _grace(self, n: int, delay: float) -> Any:
        """A timer: attempt n's silence after empty headers commits the call to it once it has lasted."""
        return TIMERS.schedule(delay, lambda: self._event(lambda: self._silence_lasted(n), n))

    def _silence_lasted(self, n: int) -> List[Action]:
        """(Under the lock.) Attempt n's silence after empty headers lasted: it answered, and its server sends
        headers ahead of its response (Method.first_whole)."""
        self._method.headers_early()
        return self._answer(n)

    def _wait(self, generation: int) -> None:
        with self._lock:
            token = self._tokens.popleft()

        def listener() -> None:
            self._event(lambda: self._machine.subchannels_changed(monotonic()) if self._wait_token == token
                        else [])

        self._listener = listener
        if not self._method.subchannels.when_changed(generation, listener):
            TIMERS.schedule(0.0, listener)  # they changed while the machine looked: not on this thread's stack

    def _unwait(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            self._method.subchannels.remove_listener(listener)

    def _deliver(self, n: int) -> None:
        call, response = self._last
        self._outcome(call, self._machine.previous(n), response, self._delivered)
        self._finish()

    def _end(self, code: int) -> None:
        self._local(code, self._local_details)
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
            self._outboxes.clear()
            self._finished = True
            self._changed.notify_all()
            call_callbacks, self._call_callbacks = self._call_callbacks, []
            done_callbacks, self._done_callbacks = self._done_callbacks, []
            graces = list(self._graces.values())
            self._graces.clear()
        if timer is not None:
            timer.cancel()
        for grace in graces:
            grace.cancel()
        self._unwait()
        self._calls.discard(self)
        for callback in call_callbacks:
            _run_callback(callback)
        for done_callback in done_callbacks:
            _run_callback(done_callback, self)

    # -- what the attempts report -------------------------------------------------------------------------------

    def _ended(self, n: int, call: Any) -> None:
        """Attempt n ended (grpcio's callback, or its watcher): its status goes to the machine — after the first
        message, if a thread is reading that one: the message came first, and commits."""
        self._event(lambda: self._status(n, call), n)

    def _status(self, n: int, call: Any) -> List[Action]:
        """(Under the lock.) Attempt n's status, read without blocking, for the machine."""
        if n in self._reads:
            self._deferred[n] = call
            return []
        code, details, trailing, _, initial = internals.sync_status(call)
        self._live.discard(n)
        self._attempts.pop(n, None)
        self._outboxes.pop(n, None)
        if self._current == n:
            self._current = -1
        response = self._responses.pop(n, None)
        if response is None and code is _OK and self._method.unary_response:
            response = internals.sync_response(call)
        self._last = call, response
        self._changed.notify_all()
        # (0 for OK without StatusCode.value: an enum's property, interpreted Python even where the caller is compiled)
        return self._machine.status(n, 0 if code is _OK else code.value[0], details, trailing, monotonic(),
                                    bool(initial) and code is not _OK and not self._hedged)

    def _headers_came(self, n: int, attempt: Any) -> None:
        """A hedged unary attempt's headers came (grpcio's spin thread): headers commit the call to it; empty ones
        may be a Trailers-Only response, so only its response or silence after them does."""
        if attempt.initial_metadata():
            self._event(lambda: self._heard_now(n), n)
            return
        with self._lock:
            if self._blocking and self._silent is None and len(self._live) == 1 and n in self._live:
                # A blocking call's only attempt: until the hedging timer fires or the attempt ends, nothing can
                # see the commit its silence would make, and both look at the silence then (no timer per call).
                self._silent = (n, monotonic())
            else:
                self._graces[n] = self._grace(n, HEADERS_GRACE)  # (under the lock: see _arm)

    def _heard_now(self, n: int) -> List[Action]:
        """(Under the lock.) Attempt n's headers, with metadata, came: they commit the call."""
        self._heard = (n, monotonic())
        return self._answer(n)

    def _headers_first_ended(self, n: int, attempt: Any) -> None:
        """A hedged unary attempt ended (grpcio's spin thread): a response commits the call to it (unless its
        headers did already), then its status goes to the machine."""
        self._event(lambda: self._responded(n, attempt), n)

    def _responded(self, n: int, attempt: Any) -> List[Action]:
        """(Under the lock.)"""
        grace = self._graces.pop(n, None) if self._graces else None
        if grace is not None:
            grace.cancel()
        actions: List[Action] = []
        heard = self._heard
        if heard is not None and heard[0] == n and monotonic() - heard[1] >= EARLY_HEADERS:
            self._method.headers_early()
        responded = internals.sync_response(attempt) is not None
        winner = self._machine.winner
        if responded and winner != n:
            actions = self._machine.message(n, monotonic())
        elif winner < 0 and attempt.initial_metadata():  # one batch (Method.first_whole): they came with its end
            actions = self._machine.headers(n, monotonic())
        silent = self._silent
        if silent is not None and silent[0] == n:
            self._silent = None
            now = monotonic()
            if not responded and now - silent[1] >= HEADERS_GRACE and self._machine.winner != n:
                self._method.headers_early()
                actions = self._machine.headers(n, now)  # its silence lasted: it won before it ended
        return actions + self._status(n, attempt)

    def _watch(self, n: int, call: Any) -> None:
        """A hedge, on the watch pool: report its first answer (headers, or a message), which commits the call;
        a unary response's winner then reads its response, and reports its end."""
        try:
            message = self._first_answer(n, call)
            if self._method.unary_response:
                if self._method.attempt_streams:  # a unary call in the shape that shows its headers first
                    with self._lock:
                        read = self._machine.winner == n and n in self._live
                    if read:
                        if message is None:
                            message = _read(call)
                        if message is not _EOF:
                            with self._lock:
                                self._responses[n] = message
                internals.sync_wait_end(call)
                self._ended(n, call)
        except Exception:  # never let a watcher die silently: the call would hang
            log.exception("grpc_retry hedge watcher failed")
            self._fail(grpc.StatusCode.INTERNAL, "grpc_retry hedge watcher failed")

    def _first_answer(self, n: int, call: Any) -> Any:
        """Block until attempt n answers or ends; tell the machine when it answers. Returns the first message if
        this read it (None if not)."""
        metadata, ended = internals.sync_wait_headers(call)
        with self._lock:
            if ended or self._machine.winner == n or n not in self._live:
                return None
        if metadata:
            self._event(lambda: self._answer(n), n)
            return None
        # Empty headers: real ones, or a Trailers-Only response whose status is a moment behind. Read ahead: a
        # message commits, the end does not, silence after the headers does.
        grace = self._grace(n, HEADERS_GRACE)
        try:
            message = self._read_first(n, call, keep=True)
        finally:
            grace.cancel()
        return None if message is _EOF else message

    def _read_first(self, n: int, call: Any, keep: bool) -> Any:
        """Read attempt n's first message before it has won (other readers of n, and its end if that comes
        meanwhile, wait for this read). A message commits the call to n; `keep`: for the application's first
        read. Returns the message, or _EOF when the attempt ended."""
        with self._lock:
            self._reads.add(n)
        message = _EOF
        try:
            if self._method.attempt_streams:
                message = _read(call)
            else:  # a stream-unary attempt: its response comes with its end
                internals.sync_wait_end(call)
        finally:
            with self._lock:
                self._reads.discard(n)
                self._changed.notify_all()
                actions = []
                if message is not _EOF and not self._ending and n in self._live:
                    if keep:
                        self._peek = (n, message)
                    actions = self._answer(n)
                ended = self._deferred.pop(n, None)
                if ended is not None and not self._ending and n in self._live:
                    actions = actions + self._status(n, ended)
                self._note(actions)
                drain = self._claim_drain()
            if drain:
                self._drain()
        return message

    def _answer(self, n: int) -> List[Action]:
        """(Under the lock.) Attempt n, live, answered: the call is its own (if it was not already)."""
        return self._machine.headers(n, monotonic()) if self._machine.winner != n else []

    def _reading(self, peeked: bool = False) -> Tuple[int, Any]:
        """(Under the lock.) The attempt to read: the winner, or (not hedged) the attempt in flight; waits for one
        to start. (-1, None) once the call has ended, or (`peeked`) once the winner's first message is in `_peek`
        and the winner is no longer in flight."""
        while True:
            winner = self._machine.winner
            n = winner if winner >= 0 else (-1 if self._watched else self._current)
            call = self._attempts.get(n)
            if call is not None and n not in self._reads:
                return n, call
            if call is None and (self._finished or peeked and n >= 0 and self._peek is not None
                                 and self._peek[0] == n):
                return -1, None
            self._changed.wait()

    def _next_message(self) -> Any:
        """A response stream's next response (StreamingCall's __next__; here, on the compiled base, `self` is
        typed: its fields are C fields, not looked up by name)."""
        while True:
            with self._lock:
                n, call = self._reading(True)
                peek = self._peek
                if peek is not None and peek[0] == self._machine.winner:
                    # The winner's first message, read before it won: first, even once the attempt has ended (its
                    # status may be in before the application reads).
                    self._peek = None
                    committed = True
                else:
                    peek = None
                    committed = n == self._machine.winner
            if peek is not None:
                message = peek[1]
            elif call is None:  # the call ended
                if self._error is not None:
                    raise self._error
                raise StopIteration()
            else:
                message = _read(call) if committed else self._read_first(n, call, keep=False)
            if message is not _EOF:
                response = self._method.deserialize(message)
                if response is UNDESERIALIZABLE:
                    self._fail(grpc.StatusCode.INTERNAL, DESERIALIZE_FAILED)
                    raise cast(RpcError, self._error)
                self._delivered = True
                return response
            with self._lock:
                self._until_told(n)

    def _until_told(self, n: int) -> None:
        """(Under the lock.) Attempt n ended: wait until the machine has its status (grpcio's callback brings
        it) and has retried or ended the call."""
        while n in self._live and not self._finished:
            self._changed.wait()

    # -- request streams ------------------------------------------------------------------------------------------

    def _attempt_requests(self, n: int) -> Iterator[Any]:
        """Attempt n's request iterator (consumed by grpcio's thread): what the machine writes to it. When it has
        nothing to send and the application's iterator has more, it pulls the next message for every attempt."""
        wrote = False
        while True:
            if wrote:
                self._event(lambda: self._machine.wrote(n, monotonic()), n)
            with self._lock:
                while True:
                    outbox = self._outboxes.get(n)
                    if outbox is None:
                        return
                    if outbox:
                        item = outbox.popleft()
                        break
                    if not self._pulling and not self._exhausted and self._machine.wants_message(n):
                        self._pulling = True
                        item = None
                        break
                    self._changed.wait()
            if item is None:
                self._pull()
                wrote = False
                continue
            if item is _HALF_CLOSE:
                return
            wrote = True
            yield item

    def _pull(self) -> None:
        try:
            try:
                request = next(self._requests)
            except StopIteration:
                self._exhausted = True
                self._event(lambda: self._machine.half_close(monotonic()))
                return
            except Exception:
                log.exception("request iterator failed")
                self._exhausted = True
                self._fail(grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
                return
            try:
                data = request if self._serializer is None else self._serializer(request)
            except Exception:
                log.exception("request serializer failed")
                self._exhausted = True
                self._fail(grpc.StatusCode.INTERNAL, "Exception serializing request!")
                return
            self._event(lambda: self._machine.send_message(data, monotonic()))
        finally:
            with self._lock:
                self._pulling = False
                self._changed.notify_all()

    # -- ending ---------------------------------------------------------------------------------------------------

    def _fail(self, code: grpc.StatusCode, details: str) -> bool:
        with self._lock:
            if self._ending:
                return False
            self._local_details = details
        self._event(lambda: self._machine.cancel(code.value[0], monotonic()))
        return True

    def cancel(self) -> bool:
        return self._fail(grpc.StatusCode.CANCELLED, CANCELLED_DETAILS)

    def close_channel(self) -> None:
        """The channel is closing. With an attempt in flight, the subchannel's close ends that attempt, as
        grpcio's close ends its own calls; otherwise the call ends CANCELLED now."""
        with self._lock:
            if self._ending or self._live:
                return
        self._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)

    def closed(self, timeout: float) -> None:
        """After the subchannels' close: wait (at most `timeout`) for it to end the call's attempts, end the call
        if that did not (its last attempt may have failed just before, and the call gone into backoff), and wait
        for the end (performed by whichever thread is at the call's actions)."""
        deadline = monotonic() + timeout
        with self._lock:
            while self._live and not self._finished:
                left = deadline - monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        self._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
        self._wait_finished(max(0.0, deadline - monotonic()))

    # -- grpc.Future ----------------------------------------------------------------------------------------------

    def cancelled(self) -> bool:
        """Cancelled by the application, as grpcio says (a channel's close ends calls CANCELLED, not cancelled)."""
        error = self._error
        return error is not None and error.code() == grpc.StatusCode.CANCELLED and \
            error.details() == CANCELLED_DETAILS

    def running(self) -> bool:
        return not self._finished

    def done(self) -> bool:
        return self._finished

    def _wait_finished(self, timeout: Optional[float]) -> bool:
        """Until the call has ended, or `timeout` seconds: whether it has."""
        if self._finished:
            return True
        with self._lock:
            if timeout is None:
                while not self._finished:
                    self._changed.wait()
                return True
            deadline = monotonic() + timeout
            while not self._finished:
                left = deadline - monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def polled_result(self) -> Any:
        """(A blocking hedged unary call's caller.) Poll each attempt made for this thread, until the call has
        ended and none is left unpolled (each must be, to its end: nothing else takes its events); then the
        result. Interrupted, the call is cancelled, and the exception goes on."""
        lock = self._lock
        try:
            while True:
                with lock:
                    while self._unpolled is None and (self._poller or not self._finished):
                        self._changed.wait()
                    attempt, self._unpolled = self._unpolled, None
                if attempt is None:
                    break
                try:
                    attempt.poll()
                finally:
                    with lock:
                        self._poller = False
        except BaseException:
            self._abandon()
            raise
        return self.result()

    def _poll_done(self) -> None:
        """(A blocking hedged call handed over by its inline driver.) The caller's thread has polled attempt 0 to
        its end: it can poll another."""
        with self._lock:
            self._poller = False
            self._changed.notify_all()

    def _abandon(self) -> None:
        """The blocking caller has gone (interrupted): the call is cancelled, and its attempts are polled
        elsewhere."""
        with self._lock:
            self._polled = False  # an attempt made for this thread from now on is polled elsewhere
            attempt, self._unpolled = self._unpolled, None
        self.cancel()
        if attempt is not None:
            _poll_elsewhere(self._method, attempt)

    def _until_done(self, timeout: Optional[float]) -> None:
        if not self._wait_finished(timeout):
            raise grpc.FutureTimeoutError()

    def result(self, timeout: Optional[float] = None) -> Any:
        self._until_done(timeout)
        if self._error is not None:
            if self.cancelled():
                raise grpc.FutureCancelledError()
            raise self._error
        return self._response

    def exception(self, timeout: Optional[float] = None) -> Optional[Exception]:
        self._until_done(timeout)
        if self.cancelled():
            raise grpc.FutureCancelledError()
        return self._error

    def traceback(self, timeout: Optional[float] = None) -> Any:
        error = self.exception(timeout)
        return None if error is None else traceback_of(error)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if not self._finished:
                self._done_callbacks.append(fn)
                return
        fn(self)

    # -- grpc.Call ------------------------------------------------------------------------------------------------

    def is_active(self) -> bool:
        return not self._finished

    def time_remaining(self) -> Optional[float]:
        deadline = self._machine.deadline
        return None if deadline == INF else max(0.0, deadline - monotonic())

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if self._finished:
                return False
            self._call_callbacks.append(callback)
            return True

    def initial_metadata(self) -> Any:
        self._until_done(None)
        return self._error.initial_metadata() if self._error is not None else self._final.initial_metadata()

    def trailing_metadata(self) -> Any:
        self._until_done(None)
        return self._error.trailing_metadata() if self._error is not None else self._final.trailing_metadata()

    def code(self) -> grpc.StatusCode:
        self._until_done(None)
        return self._error.code() if self._error is not None else _OK

    def details(self) -> Any:
        self._until_done(None)
        return self._error.details() if self._error is not None else self._final.details()

    def debug_error_string(self) -> Optional[str]:
        self._until_done(None)
        return None if self._error is None else self._error.debug_error_string()


# (grpcio's Future is not generic; its time_remaining() is typed float where grpcio's calls return None too)
class Call(_NonBlocking, grpc.Call, grpc.Future):  # type: ignore[type-arg, misc]
    """A non-blocking call: grpc.Future and grpc.Call (futures, hedged blocking calls); a response stream adds
    the iterator (StreamingCall)."""


class StreamingCall(Call):
    """A response stream: an iterator that is also a grpc.Call and a grpc.Future, as grpcio's. Once the call has
    committed, reads go straight to the winning attempt; before that, a reader reads ahead on the attempt in
    flight (not hedged), whose first message commits, or waits for a hedge to answer."""

    def __iter__(self) -> StreamingCall:
        return self

    __next__ = next = _NonBlocking._next_message

    def initial_metadata(self) -> Any:
        # As grpcio: as soon as the headers come. The application has then seen the attempt: it commits.
        while True:
            with self._lock:
                n, call = self._reading()
            if call is None:
                if self._error is not None:
                    return self._error.initial_metadata()
                return self._final.initial_metadata() if self._final is not None else ()
            if self._machine.winner != n:
                self._first_answer(n, call)
            if self._machine.winner == n:
                return internals.sync_wait_headers(call)[0]
            with self._lock:
                self._until_told(n)


def _requests_of(request_iterator: Any) -> Any:
    """The application's requests; one that cannot be iterated fails the call when its first request is due, as
    on grpcio (UNKNOWN, "Exception iterating requests!"), not at the call site."""
    try:
        return iter(request_iterator)
    except TypeError as error:
        return _raising(error)


def _raising(error: Exception) -> Any:
    raise error
    yield  # a generator


def _read(call: Any) -> Any:
    """An attempt's next message, or _EOF when it has ended (its status then tells how)."""
    try:
        return next(call)
    except (StopIteration, grpc.RpcError):
        return _EOF


def _poll_elsewhere(method: Any, attempt: Any) -> None:
    """A polled attempt whose caller has gone (its call cancelled): poll it to its end on a worker thread, so that
    its events, and grpcio's call, do not stay behind."""
    try:
        method.workers.submit(attempt.poll)
    except RuntimeError:  # the channel closed meanwhile: its close cancelled the attempt
        threading.Thread(target=attempt.poll, name="grpc_retry-polled-attempt", daemon=True).start()


def _run_callback(callback: Callable[..., None], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:
        log.exception("callback of a grpc_retry call failed")
