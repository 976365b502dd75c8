"""The synchronous driver of futures, response streams and hedged blocking calls (`_NonBlocking`, under Call and
StreamingCall in sync/_call.py): grpc's sync call objects over the call machine, whose attempts are grpc sync
calls on subchannels, carrying bytes.

One lock per call: events are decided under it, and the actions they bring are performed outside it, in order,
by whichever thread brought them (grpc-java's RetriableStream shape). A blocking unary call runs its attempts
inline on the caller's thread, and so does a blocking stream-unary call (sync/_request_stream.py). Futures and
response iterators progress on grpc's done callbacks, the shared timer thread and subchannel listeners; nothing
here ever calls a grpcio method that can block from grpcio's own thread (an ended attempt's status is read from
its state). A hedged unary attempt reports its headers and its end from grpcio's spin thread
(the direct transport's SyncHeadersFirst), or, in a blocking call, from the caller's thread, which polls it as it waits
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
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Type, TypeVar

import grpc

from grpc_retry._core import CANCEL, DELIVER, END, START, TIMER, UNWAIT, WAIT, CallMachine
from grpc_retry._transport import transport as internals

if TYPE_CHECKING:
    from grpc_retry._core import Action  # (kind, attempt, argument): an action the machine decided

from grpc_retry import _driver as driver
from grpc_retry._driver import (
    CANCELLED_DETAILS,
    CLOSED_DETAILS,
    INF,
    log,
)
from grpc_retry._timer import TIMERS
from grpc_retry._waiters import Waiters
from grpc_retry.sync._attempts import (
    ENDED,
    HALF_CLOSE,
    _Attempts,
    poll_elsewhere,
    read_message,
    requests_of,
    run_callback,
)

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED


_C = TypeVar("_C", bound="_NonBlocking")


class _NonBlocking(_Attempts):
    """A non-blocking call's state and work (an extension type, sync/_nonblocking.pxd); sync/_call.py adds what
    the application's threads do, and grpcio's abstract classes."""

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
        self._requests: Any = None if request_iterator is None else requests_of(request_iterator)
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
    def adopting(cls: Type[_C], inline: Any, actions: List[Action], attempt: Any, timer_at: float) -> _C:
        """(Under `inline`'s lock.) A blocking hedged call that its inline driver (sync/_hedged.py) hands over,
        with its machine's state: attempt 0 if still out (`attempt`; its caller's thread may be polling it), the
        timer the machine has armed (`timer_at`), and `actions`, what the machine has just decided. The caller
        must then _drain() it (outside its lock)."""
        call = cls(inline._method, inline._machine, inline._request, None, None, None, None, None, None, True,
                   inline)
        with call._lock:
            if attempt is not None:
                call._live.add(0)
                call._attempts[0] = attempt
                call._poller = attempt.polled
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
                    if not self._fail(grpc.StatusCode.INTERNAL, driver.INTERNAL_DETAILS):
                        self._end_broken()
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
            told = False  # it tells its headers itself (else a timed or hedged attempt's are waited for)
            if method.headers_first:  # a hedged unary attempt that reports itself (see polled_result)
                call = inner(payload, on_headers=partial(self._headers_came, n),
                             on_end=partial(self._headers_first_ended, n), pollable=pollable, **kwargs)
            elif reports and self._watched and not self._hedged:
                # A timed response stream's attempt: its headers, told from grpcio's spin thread where the
                # transport can, stop its timer without a thread waiting for them.
                call = inner(payload, on_end=partial(self._ended, n), on_headers=partial(self._headers_came, n),
                             **kwargs)
                told = internals.sync_tells_headers(call)
            elif reports:  # a response stream's attempt that reports its end (grpcio's spin thread)
                call = inner(payload, on_end=partial(self._ended, n), **kwargs)
            elif (self._requests is None and not method.attempt_streams and not self._watched
                  and (own := internals.sync_own()) is not None):
                # an unhedged unary-unary attempt (a future, or a call through grpcio's interceptors): grpcio's
                # one batch, reported from its spin thread
                assert isinstance(payload, bytes)
                call = own.unary_attempt(inner, payload, on_end=partial(self._ended, n), **kwargs)
                reports = True
            elif self._requests is not None and (own := internals.sync_own()) is not None:
                # its requests sent from a worker of the channel's (grpcio starts a thread per call)
                assert payload is not None and not isinstance(payload, bytes)
                call = own.request_stream(inner, payload, method.workers, method.attempt_streams, **kwargs)
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
            if not self._watched or told:  # the one attempt out: a reader reads ahead on it
                self._current = n
            self._changed.notify_all()
        if elsewhere:
            poll_elsewhere(method, call)
        if method.headers_first:
            return
        if self._watched and not told:
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
        self._to_outbox(n, HALF_CLOSE)

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
        self._event(lambda: self._machine.timer(monotonic()) if self._timer_token == token else [])

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
        if self._finished:
            return  # (ended INTERNAL: an action of its end failed)
        self._local(code, self._local_details)
        self._finish()

    def _end_broken(self) -> None:
        """(The draining thread.) An action of a call already ending failed (a bug), which no cancel can end
        now: it ends INTERNAL here, unless it has ended."""
        if self._finished:
            return
        self._local_details = driver.INTERNAL_DETAILS
        try:
            self._local(grpc.StatusCode.INTERNAL.value[0], driver.INTERNAL_DETAILS)
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
            self._outboxes.clear()
            self._finished = True
            self._changed.notify_all()
            call_callbacks, self._call_callbacks = self._call_callbacks, []
            done_callbacks, self._done_callbacks = self._done_callbacks, []
        if timer is not None:
            timer.cancel()
        self._unwait()
        self._calls.discard(self)
        for callback in call_callbacks:
            run_callback(callback)
        for done_callback in done_callbacks:
            run_callback(done_callback, self)

    # -- what the attempts report -------------------------------------------------------------------------------

    def _ended(self, n: int, call: Any) -> None:
        """Attempt n ended (grpcio's callback, or its watcher): its status goes to the machine — after the first
        message, if a thread is reading that one: the message came first, and commits."""
        self._event(lambda: self._status(n, call), n)

    def _status(self, n: int, call: Any, watched_unary: bool = False) -> List[Action]:
        """(Under the lock.) Attempt n's status, read without blocking, for the machine (`watched_unary`: a watched
        unary attempt, whose response or headers with metadata may have come with its end)."""
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
        # Its headers and response as its end leaves them (a Trailers-Only response's headers are empty: headers
        # with metadata were real ones, which commit the call, whether its watcher saw them before its end or not).
        # (0 for OK without StatusCode.value: an enum's property, interpreted Python even where the caller is compiled)
        return self._machine.status(n, 0 if code is _OK else code.value[0], details, trailing, monotonic(),
                                    bool(initial), watched_unary and internals.sync_response(call) is not None)

    def _headers_came(self, n: int, attempt: Any) -> None:
        """A watched attempt's headers came, told by the attempt itself (grpcio's spin thread)."""
        empty = not attempt.initial_metadata()
        self._event(lambda: self._machine.headers(n, monotonic(), empty), n)

    def _headers_first_ended(self, n: int, attempt: Any) -> None:
        """A watched unary attempt ended (grpcio's spin thread): a response commits the call to it (unless its
        headers did already), then its status goes to the machine."""
        self._event(lambda: self._status(n, attempt, True), n)
        if self._machine.headers_ahead:
            self._method.headers_early()


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
                            message = read_message(call)
                        if message is not ENDED:
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
        self._event(lambda: self._machine.headers(n, monotonic(), not metadata), n)
        if metadata:
            return None
        # Empty headers (the machine judges the silence after them): read ahead, as a message commits the call.
        message = self._read_first(n, call, keep=True)
        return None if message is ENDED else message

    def _read_first(self, n: int, call: Any, keep: bool) -> Any:
        """Read attempt n's first message before it has won (other readers of n, and its end if that comes
        meanwhile, wait for this read). A message commits the call to n; `keep`: for the application's first
        read. Returns the message, or ENDED when the attempt ended."""
        with self._lock:
            self._reads.add(n)
        message = ENDED
        try:
            if self._method.attempt_streams:
                message = read_message(call)
            else:  # a stream-unary attempt: its response comes with its end
                internals.sync_wait_end(call)
        finally:
            with self._lock:
                self._reads.discard(n)
                self._changed.notify_all()
                actions = []
                if message is not ENDED and not self._ending and n in self._live:
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
        """(Under the lock.) Attempt n, live, has its first message: the call is its own (if it was not already)."""
        return self._machine.message(n, monotonic()) if self._machine.winner != n else []


    def _attempt_requests(self, n: int) -> Iterator[Any]:
        """Attempt n's requests, as its grpcio call takes them (_Future, sync/_call.py)."""
        raise NotImplementedError

    def _fail(self, code: grpc.StatusCode, details: str) -> bool:
        with self._lock:
            if self._ending:
                return False
            self._local_details = details
        self._event(lambda: self._machine.cancel(code.value[0], monotonic()))
        return True
