"""The sync API's one call driver (`_Driver`; sync/_caller.py adds a blocking call's caller, sync/_call.py the
application's side of Call and StreamingCall): grpc's sync call objects over the call machine, whose attempts are
grpcio sync calls on subchannels, carrying bytes.

One lock per call: events are decided under it, and the actions they bring are performed outside it, in order,
by whichever thread brought them (grpc-java's RetriableStream shape). A blocking call's caller makes and runs each
attempt the machine starts while its thread is free (sync/_caller.py); every other attempt reports itself: its end
from grpcio's spin thread (or a done callback), a hedged unary attempt its headers too; another hedge's first
answer needs a blocking read, so it is watched from one of its channel's worker threads until it answers or ends;
whoever reads a response stream reads the attempt. Timers fire on the shared timer thread, unless the caller keeps
them; waits for a subchannel end on its listener. Nothing here ever calls a grpcio method that can block from
grpcio's own thread (an ended attempt's status is read from its end record). Closing the channel ends every call:
through the subchannels' close, as grpcio's close ends its own calls, for attempts in flight; with grpcio's
"Channel closed!" for calls in backoff or waiting.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from threading import Lock, get_ident
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterator, List, Optional, Set

import grpc

from grpc_retry._core import CANCEL, DELIVER, END, START, TIMER, UNWAIT, WAIT, CallMachine
from grpc_retry._transport import transport as internals
from grpc_retry._transport.ends import end_record

if TYPE_CHECKING:
    from grpc_retry._core import Action  # (kind, attempt, argument): an action the machine decided

from grpc_retry import _driver as driver
from grpc_retry._driver import (
    CANCELLED_DETAILS,
    CLOSED_DETAILS,
    INF,
    INTERNAL_DETAILS,
    log,
)
from grpc_retry._timer import TIMERS
from grpc_retry._waiters import Waiters
from grpc_retry.sync._attempts import (
    HALF_CLOSE,
    _Attempts,
    requests_of,
    run_callback,
)

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED
LOST_END_DETAILS = f"{INTERNAL_DETAILS}: the call's end was lost"
UNUSED: Any = None  # what a call holds in place of a structure only other shapes of call use


# How a blocking call's caller makes the attempts it takes (see _Driver; none: a future or a stream)
NO_CALLER = 0
EXCHANGE = 1  # a unary exchange, waited for as grpcio's blocking call waits (its timer: its deadline)
POLLED = 2    # a unary attempt that shows its headers first, polled by the caller (others report elsewhere)
STREAMED = 3  # a stream-unary attempt, its requests sent by a worker of the channel's


class _Driver(_Attempts):
    """A call's state and work (an extension type, sync/_driver.pxd); sync/_caller.py adds what a blocking call's
    caller does, sync/_call.py what the application's threads do, and grpcio's abstract classes."""

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], request_iterator: Any,
                 serializer: Any, metadata: Any, credentials: Any, wait_for_ready: Optional[bool],
                 compression: Any) -> None:
        """A future or a response stream, started."""
        self._init_call(method, machine, request, request_iterator, serializer, metadata, credentials,
                        wait_for_ready, compression, NO_CALLER)
        self._begin()
        if self._refusal is not None:  # grpcio refused the first attempt (metadata it cannot send): as grpcio,
            raise self._refusal        # the call site raises (the call has ended, INTERNAL)

    def _init_call(self, method: Any, machine: CallMachine, request: Optional[bytes], request_iterator: Any,
                   serializer: Any, metadata: Any, credentials: Any, wait_for_ready: Optional[bool],
                   compression: Any, caller: int) -> None:
        """What the constructor does but start the call (a blocking call's caller starts it: run()), as a C call
        (a constructor's arguments are packed and parsed again)."""
        self._init_attempts(method, machine, request, metadata, credentials, wait_for_ready, compression,
                            request_iterator is not None)
        self._lock = Lock()
        # A blocking call's caller (run()): how its thread makes the attempts it takes (EXCHANGE, POLLED, STREAMED).
        # It takes each attempt the machine starts while it is free (`_job`), and keeps the machine's timer while
        # nothing it does not run is out (`_kept_at`); other attempts report from grpcio's threads and the timer's.
        self._kind = caller
        self._caller = caller != NO_CALLER   # ... and its thread is in run(), free to take an attempt
        self._busy = False                    # ... running one now
        self._job: Any = None                 # (n, address, previous): an attempt for it to make
        self._thread = 0                      # its thread's identity
        self._kept_at = INF                   # the machine's timer, kept by it: due then
        self._kept_token = 0
        self._with_call = False
        self._changed = Waiters(self._lock)  # an attempt started, ended or won; the call ended; a job or a timer
        self._queue: Deque[Action] = deque()   # decided, not yet performed
        self._draining = False
        self._hedged = machine.hedging
        self._watched = machine.watched  # hedged, or timed per attempt: each attempt's first answer is watched
        self._live: Set[int] = set()          # attempts the machine counts as live
        self._attempts: Dict[int, Any] = {}   # their grpcio calls, once started
        self._last: Any = None                # the attempt whose status the machine heard last, and its response
        # Read ahead (response streams, request streams; None where nothing reads ahead):
        ahead = method.attempt_streams or request_iterator is not None
        self._responses: Dict[int, Any] = {} if ahead else UNUSED  # a hedge's response its watcher read
        self._current = -1                    # the attempt in flight (not hedged): the one a reader reads ahead
        self._peek: Any = None                # (n, first message of n), read before n won
        self._reads: Set[int] = set() if ahead else UNUSED  # attempts whose first message is being read before
        # they won, and those which ended meanwhile: their end waits for that read
        self._deferred: Dict[int, Any] = {} if ahead else UNUSED
        self._timer: Any = None               # the timer thread's handle of the machine's timer, if armed
        self._armed_at = INF                  # ... due then
        self._armed_token = 0                 # ... decided with this token
        # Bumped as each TIMER (WAIT, UNWAIT) is decided: a timer (listener) armed for an earlier one is stale.
        # The actions are performed later, in order: each takes the token of its own decision from `_tokens`.
        self._timer_token = 0
        self._wait_token = 0
        self._tokens: Deque[int] = deque()
        self._listener: Optional[Callable[[], None]] = None
        self._ending = False                  # the machine has decided the end
        self._finished = False  # set (under the lock) as the call ends; _changed tells it
        self._local_details = CANCELLED_DETAILS
        self._delivered = False               # a response message reached the application
        self._call_callbacks: Optional[List[Callable[[], None]]] = None  # (made as the first is added)
        self._done_callbacks: Optional[List[Callable[[Any], None]]] = None
        self._calls = method.calls
        # request streams
        self._requests: Any = None if request_iterator is None else requests_of(request_iterator)
        self._serializer = serializer
        self._outboxes: Dict[int, Deque[Any]] = UNUSED if request_iterator is None else {}
        self._pulling = False
        self._exhausted = request_iterator is None
        self._calls.add(self)
        self._refusal: Optional[Exception] = None

    def _begin(self) -> None:
        """The call's start, for the machine."""
        self._lock.acquire()
        try:
            decided = self._machine.start(monotonic(), self._request)
        except Exception:  # a bug: the call ends INTERNAL, not with the bug's exception
            decided = self._broken()
        self._told(decided)

    # -- events: decided under the lock, performed outside it --------------------------------------------------

    def _event(self, decide: Callable[[], List[Action]], n: int = -1) -> None:
        """Feed an event to the machine (`decide`, called under the lock), then perform what it decided, in
        order, unless a thread is already at it. An event of attempt n (>= 0) is dropped once the machine no
        longer counts n as live (cancelled, or its end already told). (The events on a call's path do the same
        inline: _told.)"""
        lock = self._lock
        lock.acquire()  # (not `with`, on the call's path: compiled, a `with` binds two of the lock's methods)
        try:
            if self._ending or n >= 0 and n not in self._live:
                return
            try:
                decided = decide()
            except Exception:  # a bug (the event runs on a timer's or grpcio's thread): end the call, not leave it
                decided = self._broken()
            actions = self._take(decided)
        finally:
            lock.release()
        if actions is not None:
            self._drain(actions)

    def _broken(self) -> List[Action]:
        """(Under the lock, in an exception handler.) What ends the call when its machine failed (a bug)."""
        self._local_details = driver.INTERNAL_DETAILS
        return driver.broken(self._live)

    def _take(self, decided: List[Action]) -> Optional[List[Action]]:
        """(Under the lock.) Note what the machine decided, and queue it; what this thread is to perform now (all
        that is queued), or None if another thread is at it."""
        self._note(decided)
        queue = self._queue
        if self._draining:
            queue.extend(decided)
            return None
        self._draining = True
        if not queue:
            return decided
        queue.extend(decided)
        actions = list(queue)
        queue.clear()
        return actions

    def _told(self, decided: List[Action]) -> None:
        """(Holding the lock, which this releases.) Perform what an event decided, as _event() does."""
        try:
            actions = self._take(decided)
        finally:
            self._lock.release()
        if actions is not None:
            self._drain(actions)

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

    def _drain(self, actions: Optional[List[Action]] = None) -> None:
        """(The thread that claimed the drain.) Perform `actions` (taken off the queue already), then what is
        queued, until nothing is."""
        queue = self._queue
        while True:
            if actions is None:
                lock = self._lock
                lock.acquire()  # what is queued so far, taken at once (each is performed in order)
                try:
                    if not queue:
                        self._draining = False
                        return
                    actions = list(queue)
                    queue.clear()
                finally:
                    lock.release()
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
        if (self._caller and self._thread == get_ident() and not self._busy and self._job is None
                and self._requests is None and n in self._live):
            # The caller's thread, performing what it decided, is free: it makes the attempt next (run()). (No
            # lock: only the thread performing actions sets a job, and only the caller's takes one or is busy.)
            self._job = (n, address, previous)
            return
        with self._lock:
            if n not in self._live:
                return  # cancelled before it started
            if self._requests is not None:
                self._outboxes[n] = deque()  # (what the machine writes to it from now on)
            if self._caller and not self._busy and self._job is None:
                self._job = (n, address, previous)  # the caller's thread makes it (run())
                self._changed.notify_all()
                return
        method = self._method
        try:
            inner = method.inner(address)
            kwargs = self._kwargs(n, address, previous)
            payload = self._request if self._requests is None else self._attempt_requests(n)
            told = False  # it tells its headers itself (else a timed or hedged attempt's are waited for)
            if method.headers_first:  # a hedged unary attempt that reports itself from grpcio's spin thread
                call = inner(payload, on_headers=partial(self._headers_came, n),
                             on_end=partial(self._headers_first_ended, n), **kwargs)
            elif self._watched and not self._hedged:
                # A timed attempt: its headers, told from grpcio's spin thread where the transport can, stop its
                # timer without a thread waiting for them.
                call = inner(payload, on_end=partial(self._ended, n), on_headers=partial(self._headers_came, n),
                             **kwargs)
                told = internals.sync_tells_headers(call)
            else:  # it reports its end (from grpcio's spin thread, or a worker)
                call = inner(payload, on_end=partial(self._ended, n), **kwargs)
        except Exception as error:  # the channel closed meanwhile, or grpcio refused the call
            self._not_started(error)
            return
        method.attempt_started(address)
        with self._lock:
            if n in self._live or not call.done():  # else it ended already, and the machine heard its status
                self._attempts[n] = call
            if not self._watched or told:  # the one attempt out: a reader reads ahead on it
                self._current = n
            self._changed.notify_all()
        if method.headers_first:
            return
        if self._watched and not told:
            try:
                method.workers.submit(self._watch, n, call)
            except RuntimeError as error:  # the channel closed meanwhile
                self._not_started(error)
                return
            if method.unary_response:
                return  # (its watcher reports its end too, once it has its response)

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
            if self._outboxes is not None:
                self._outboxes.pop(n, None)
            if self._responses:
                self._responses.pop(n, None)
            if self._current == n:
                self._current = -1
            self._changed.notify_all()
        if call is not None:
            call.cancel()

    def _commit(self, n: int) -> None:
        if not self._caller:
            with self._lock:
                self._changed.notify_all()  # readers waiting for a winner (a blocking call has none)

    def _arm(self, at: float) -> None:
        # Scheduled under the call's lock: the timer thread calls back holding none of its own, so this cannot
        # deadlock with _due.
        if at == INF and self._timer is None and self._kept_at == INF:
            self._tokens.popleft()  # (nothing armed to disarm: the draining thread alone pops tokens)
            return
        lock = self._lock
        lock.acquire()
        try:
            timer, self._timer = self._timer, None
            token = self._tokens.popleft()
            self._kept_at = INF
            if at != INF and self._timer_token == token and not self._ending:
                if self._caller and (self._kind != POLLED or not self._live):
                    # The caller's thread keeps it: the attempts out are the caller's, which run to their end
                    self._kept_at, self._kept_token = at, token
                    self._changed.notify_all()
                else:
                    self._armed_at, self._armed_token = at, token
                    self._timer = TIMERS.schedule(at - monotonic(), self._due, False, self._method)
        finally:
            lock.release()
        if timer is not None:
            timer.cancel()  # (takes no lock)

    def _due(self) -> None:
        """(The timer thread.) The machine's timer is due, unless it was superseded as it fired."""
        self._lock.acquire()
        if self._timer is None or monotonic() < self._armed_at:
            self._lock.release()
            return
        self._timer = None
        self._fire(self._armed_token)

    def _fire(self, token: int) -> None:
        """(Holding the lock, which this releases.) The timer of the TIMER decided with `token` fires, unless a
        later one was decided since."""
        if self._ending or self._timer_token != token:
            self._lock.release()
            return
        try:
            decided = self._machine.timer(monotonic())
        except Exception:  # a bug (on the timer thread, which would only log it): end the call, not leave it
            decided = self._broken()
        self._told(decided)

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
        lock = self._lock
        lock.acquire()
        try:
            timer, self._timer = self._timer, None
            if self._requests is not None:
                self._outboxes.clear()
            self._finished = True
            self._changed.notify_all()
            call_callbacks, self._call_callbacks = self._call_callbacks, None
            done_callbacks, self._done_callbacks = self._done_callbacks, None
        finally:
            lock.release()
        if timer is not None:
            timer.cancel()
        if self._listener is not None:
            self._unwait()
        self._calls.discard(self)
        if call_callbacks:
            for callback in call_callbacks:
                run_callback(callback)
        if done_callbacks:
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
        if self._reads and n in self._reads:
            self._deferred[n] = call
            return []
        code, details, trailing, _, initial = internals.sync_status(call)
        self._live.discard(n)
        self._attempts.pop(n, None)
        if self._outboxes is not None:
            self._outboxes.pop(n, None)
        if self._current == n:
            self._current = -1
        response = self._responses.pop(n, None) if self._responses else None
        if response is None and code is _OK and self._method.unary_response:
            response = internals.sync_response(call)
        self._last = call, response
        self._changed.notify_all()
        # Its headers and response as its end leaves them (a Trailers-Only response's headers are empty: headers
        # with metadata were real ones, which commit the call, whether its watcher saw them before its end or not).
        # (0 for OK without StatusCode.value: an enum's property, interpreted Python even where the caller is compiled)
        return self._machine.status(n, 0 if code is _OK else code.value[0], details, trailing, monotonic(),
                                    bool(initial), watched_unary and internals.sync_response(call) is not None)

    def _unary_ended(self, n: int, attempt: Any) -> List[Action]:
        """(Under the lock.) A watched unary attempt's end, from its end record, for the machine: its headers and
        response as its end leaves them (a Trailers-Only response's headers are empty: headers with metadata were
        real ones, which commit the call, whether they were told before its end or not)."""
        state = end_record(attempt)
        code = state.code
        assert code is not None  # (it has ended)
        self._live.discard(n)
        self._attempts.pop(n, None)
        if self._current == n:
            self._current = -1
        if attempt.polled:  # its end, told on the caller's thread: free to take the next attempt
            self._busy = False
        response = state.response
        self._last = attempt, response if code is _OK else None
        self._changed.notify_all()
        # (0 for OK without StatusCode.value: an enum's property, interpreted Python even where the caller is compiled)
        return self._machine.status(n, 0 if code is _OK else code.value[0], state.details, state.trailing_metadata,
                                    monotonic(), bool(state.initial_metadata), response is not None)

    def _headers_came(self, n: int, attempt: Any) -> None:
        """A watched attempt's headers came, told by the attempt itself (grpcio's spin thread)."""
        empty = not attempt.initial_metadata()
        self._event(lambda: self._machine.headers(n, monotonic(), empty), n)

    def _headers_first_ended(self, n: int, attempt: Any) -> None:
        """A watched unary attempt ended (grpcio's spin thread, or the caller polling it): a response commits the
        call to it (unless its headers did already), then its status goes to the machine."""
        self._lock.acquire()
        if self._ending or n not in self._live:
            self._lock.release()
            return
        try:
            decided = self._unary_ended(n, attempt)
        except Exception:  # a bug (on grpcio's thread, which would only log it): end the call, not leave it
            decided = self._broken()
        self._told(decided)

    def _watch(self, n: int, call: Any) -> None:
        """A hedge's first answer, watched from a worker of the channel's (_Future, sync/_call.py)."""
        raise NotImplementedError

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
