"""The synchronous driver: grpc's sync call objects over attempts that are plain grpc sync calls, each on the
subchannel the picker chose for it (avoiding the backends the call already used).

Blocking calls (`__call__`, `with_call`) run their attempts inline in the calling thread. Futures run on
attempt-done callbacks, subchannel-change listeners and the shared timer thread. Response iterators are driven
by the thread that reads them. No call holds a thread of its own (grpcio's own request-consumer thread per
streaming attempt aside).
"""

from __future__ import annotations

import logging
import threading
from time import monotonic, sleep
from typing import Any, Callable, List, Optional

import grpc

from grpc_retry._core import NOT_SENT, RETRY, RetryCall, transparent_kind
from grpc_retry._timer import TIMERS

log = logging.getLogger("grpc_retry")

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"
_INF = float("inf")
_CANCELLED_DETAILS = "Locally cancelled by application!"
_DEADLINE_DETAILS = "Deadline Exceeded"
_CLOSED_DETAILS = "Channel closed!"
_OK = grpc.StatusCode.OK

# What asking for the next attempt came to when no attempt could start.
WAIT = 1       # no subchannel can take it now: wait for a change (Attempts.since), or fail fast
DEADLINE = 2   # the call's deadline has passed


def with_attempts(trailing, previous: int):
    return tuple(trailing or ()) + ((PREVIOUS_ATTEMPTS, str(previous)),)


def attempt_metadata(metadata: tuple, previous: int) -> tuple:
    return metadata if previous == 0 else metadata + ((PREVIOUS_ATTEMPTS, str(previous)),)


def attempt_timeout(core: RetryCall, now: float) -> Optional[float]:
    deadline = core.deadline
    return None if deadline == _INF else deadline - now


class RpcError(grpc.RpcError, grpc.Call, grpc.Future):
    """A call's final non-OK status, frozen: what grpcio raises, with grpc_retry's trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: Optional[str], initial=(), trailing=(),
                 debug: Optional[str] = None):
        super().__init__()
        self._code, self._details, self._initial, self._trailing, self._debug = (
            code, details, initial, trailing, debug)

    @classmethod
    def from_error(cls, error: grpc.RpcError, previous: int) -> RpcError:
        debug = error.debug_error_string() if hasattr(error, "debug_error_string") else None
        return cls(error.code(), error.details(), error.initial_metadata(),
                   with_attempts(error.trailing_metadata(), previous), debug)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return self._initial

    def trailing_metadata(self):
        return self._trailing

    def debug_error_string(self):
        return self._debug

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def cancelled(self):
        return self._code == grpc.StatusCode.CANCELLED

    def running(self):
        return False

    def done(self):
        return True

    def result(self, timeout=None):
        raise self

    def exception(self, timeout=None):
        return self

    def traceback(self, timeout=None):
        return None

    def add_done_callback(self, fn):
        fn(self)

    def add_callback(self, callback):
        return False

    def __str__(self):
        return (f"<{type(self).__name__} of RPC that terminated with:\n\tstatus = {self._code}\n"
                f"\tdetails = \"{self._details}\"\n\tdebug_error_string = \"{self._debug}\"\n>")

    __repr__ = __str__


class FinishedCall(grpc.Call):
    """The grpc.Call of a successful call whose trailing metadata grpc_retry extended."""

    def __init__(self, attempt: grpc.Call, trailing):
        self._attempt, self._trailing = attempt, trailing

    def initial_metadata(self):
        return self._attempt.initial_metadata()

    def trailing_metadata(self):
        return self._trailing

    def code(self):
        return grpc.StatusCode.OK

    def details(self):
        return self._attempt.details()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def local_error(code: grpc.StatusCode, details: str) -> RpcError:
    return RpcError(code, details, (), (), None)


class RequestSource:
    """The application's request iterator, consumed once whatever the number of attempts: each attempt's
    iterator replays the core's buffer, then pulls the next message from the application (one puller at a
    time, under a lock) into that buffer."""

    def __init__(self, request_iterator, serializer, core: RetryCall, on_error: Callable[[str, str], None]):
        self._iterator = iter(request_iterator)
        self._serializer = serializer
        self._core = core
        self._lock = threading.Lock()
        self._on_error = on_error
        self.failed = False
        self.on_commit: Optional[Callable[[], None]] = None  # told when a message overflows the buffer

    def attempt_iterator(self, hedge: int = -1):
        """One attempt's request stream. A hedge (index >= 0) reports how far it got, for the core to choose
        the winner if the buffer overflows, and stops once another hedge has won."""
        core = self._core
        sent = 0
        while True:
            with self._lock:
                if hedge >= 0 and core.winner >= 0 and hedge != core.winner:
                    return
                index = sent - core.replay_base
                if index < len(core.replay):
                    message = core.replay[index]
                elif core.half_closed or self.failed or core.finished:
                    return
                else:
                    message = self._pull()
                    if message is None:
                        if self.failed:
                            # Make grpcio cancel this attempt rather than half-close a truncated stream.
                            raise RuntimeError("grpc_retry: request iterator failed")
                        return
            sent += 1
            yield message
            if hedge >= 0:
                with self._lock:
                    core.on_sent(hedge, sent)
                    if core.committed and hedge == core.winner:
                        core.trim_sent(sent)
            elif core.committed:
                with self._lock:
                    core.trim_sent(sent)

    def _pull(self) -> Optional[bytes]:
        try:
            request = next(self._iterator)
        except StopIteration:
            self._core.close_send()
            return None
        except Exception:
            log.exception("request iterator failed")
            return self._fail(grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
        try:
            data = self._serializer(request) if self._serializer is not None else request
        except Exception:
            log.exception("request serializer failed")
            return self._fail(grpc.StatusCode.INTERNAL, "Exception serializing request!")
        if not self._core.add_message(data) and self.on_commit is not None:
            self.on_commit()
        return data

    def _fail(self, code, details):
        self.failed = True
        self._on_error(code, details)
        return None


class Attempts:
    """How one call starts its attempts: which subchannel (the picker, given the addresses the call used),
    with what metadata and timeout; and whether a failed attempt is retried transparently."""

    __slots__ = ("core", "subchannels", "inner", "metadata", "credentials", "wait_for_ready", "compression",
                 "deserializer", "request", "requests", "closed", "retries_enabled", "since", "started", "stale",
                 "error")

    def __init__(self, core, subchannels, inner, metadata, credentials, wait_for_ready, compression,
                 deserializer, closed: Callable[[], bool], retries_enabled: bool):
        self.core = core
        self.subchannels = subchannels
        self.inner = inner           # inner(index): the method on subchannel `index`, carrying bytes
        self.metadata = tuple(metadata) if metadata else ()
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.retries_enabled = retries_enabled
        self.compression = compression
        self.deserializer = deserializer
        self.request = None          # bytes, for unary requests
        self.requests: Optional[RequestSource] = None
        self.closed = closed
        self.since = 0               # with WAIT: the subchannels' generation to wait past
        self.started = 0             # the generation when the current attempt started
        self.stale: Optional[int] = None  # after NOT_SENT: retry a used address only once news arrived
        self.error: Optional[grpc.RpcError] = None  # the last attempt's failure

    def next(self):
        """Start-up of the next attempt: (grpcio multicallable, kwargs), or WAIT, or DEADLINE."""
        core = self.core
        subchannels = self.subchannels
        since = subchannels.generation  # read before looking, so that no change can slip by a waiter
        index = subchannels.pick(core.used)
        now = monotonic()
        if index < 0 or (self.stale == since and (core.used >> index) & 1):
            if now >= core.deadline:
                return DEADLINE
            self.since = since
            return WAIT
        previous = core.begin_attempt(now)
        if previous < 0:
            return DEADLINE
        core.use_address(index)
        self.started, self.stale = since, None
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: attempt %d (previous %d) on %s", id(core), core.attempts, previous,
                      subchannels.addresses[index])
        return self.inner(index), dict(
            timeout=attempt_timeout(core, now), metadata=attempt_metadata(self.metadata, previous),
            credentials=self.credentials, wait_for_ready=self.grpc_wait_for_ready(), compression=self.compression)

    def grpc_wait_for_ready(self) -> bool:
        """What the attempt tells grpcio. grpc_retry waits for ready itself where it can replay the attempt
        (see transparent()), so that an address that cannot connect does not hold a waiting call while another
        could take it; grpcio waits as usual when retries are off or a committed request stream cannot be
        replayed."""
        if not self.wait_for_ready:
            return False
        return not self.retries_enabled or (self.requests is not None and self.core.committed)

    def transparent(self, code: grpc.StatusCode, details: Optional[str]) -> bool:
        """The attempt just failed with `code`: if the server's application never saw it, retry it at once
        and uncounted (True). A refused attempt is retried once per call; one that never left the client goes
        to an address the call has not tried, or, for a call that waits for ready, waits for news."""
        kind = transparent_kind(code.value[0], details)
        if kind < 0:
            return False
        core = self.core
        if kind == NOT_SENT:
            index = self.subchannels.pick(core.used)
            if index < 0 or (core.used >> index) & 1:
                if not self.wait_for_ready:
                    return False
                self.stale = self.started
        if not core.on_transparent(kind, monotonic()):
            self.stale = None
            return False
        if log.isEnabledFor(logging.DEBUG):
            log.debug("call %x: transparent retry after %s: %s", id(core), code, details)
        return True

    def ending(self, step: int) -> Optional[grpc.RpcError]:
        """No attempt could start (`step`): the error that ends the call, or None when it is to wait."""
        if step == DEADLINE:
            return local_error(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
        if self.closed():
            return local_error(grpc.StatusCode.CANCELLED, _CLOSED_DETAILS)
        if self.subchannels.resolved and not self.wait_for_ready:
            # Fail fast, as grpcio does when its channel is in TRANSIENT_FAILURE.
            if self.error is None:
                return local_error(grpc.StatusCode.UNAVAILABLE, self.subchannels.unavailable_details())
            previous = self.core.attempts - 1
            return self.error if previous == 0 else RpcError.from_error(self.error, previous)
        return None

    def wait(self, event: Optional[threading.Event] = None) -> None:
        """Block until the subchannels change after `since`, the deadline, or `event`."""
        deadline = self.core.deadline
        timeout = None if deadline == _INF else max(0.0, deadline - monotonic())
        self.subchannels.wait_change(timeout, self.since, event)

    def payload(self):
        return self.request if self.requests is None else self.requests.attempt_iterator()

    def deserialize(self, response):
        return response if self.deserializer is None else self.deserializer(response)


def blocking_call(attempts: Attempts, with_call: bool):
    """Run a unary-response call inline in the calling thread: attempts, waits, backoff sleeps and all."""
    core = attempts.core
    while True:
        step = attempts.next()
        if step.__class__ is int:
            error = attempts.ending(step)
            if error is None:
                attempts.wait()
                if not attempts.closed():
                    continue
                error = local_error(grpc.StatusCode.CANCELLED, _CLOSED_DETAILS)
            core.finish()
            raise error
        multicallable, kwargs = step
        try:
            response, call = multicallable.with_call(attempts.payload(), **kwargs)
        except grpc.RpcError as error:
            if attempts.requests is not None and attempts.requests.failed:
                core.finish()
                raise  # the caller replaces it with the request iterator's failure
            attempts.error = error
            if attempts.transparent(error.code(), error.details()):
                continue
            if error.initial_metadata():
                core.on_headers()
            if core.on_status(error.code().value[0], error.trailing_metadata(), monotonic()) == RETRY:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("call %x: attempt %d failed %s, retrying in %.3fs", id(core), core.attempts,
                              error.code(), core.delay)
                if core.delay > 0:
                    sleep(core.delay)
                if attempts.closed():
                    core.finish()
                    raise local_error(grpc.StatusCode.CANCELLED, _CLOSED_DETAILS) from None
                continue
            previous = core.attempts - 1
            core.finish()
            if previous == 0:
                raise
            raise RpcError.from_error(error, previous) from None
        core.on_status(0, None, 0.0)
        previous = core.attempts - 1
        try:
            response = attempts.deserialize(response)
        except Exception:
            log.exception("response deserializer failed")
            raise local_error(grpc.StatusCode.INTERNAL, "Exception deserializing response!") from None
        if not with_call:
            return response
        if previous > 0:
            call = FinishedCall(call, with_attempts(call.trailing_metadata(), previous))
        return response, call


class _CallBase(grpc.Call, grpc.Future):
    """Status plumbing of the non-blocking calls: one lock, one done event, callbacks run once."""

    def __init__(self, attempts: Attempts, registry):
        self._attempts = attempts
        self._core: RetryCall = attempts.core
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._attempt = None
        self._timer = None
        self._listening = False  # a subchannel-change listener is registered (UnaryFuture waiting)
        self._error: Optional[grpc.RpcError] = None
        self._response = None
        self._call_callbacks: List[Callable[[], None]] = []
        self._done_callbacks: List[Callable[[Any], None]] = []
        self._registry = registry
        registry.add(self)

    # -- ending ---------------------------------------------------------------------------------------

    def _finish(self, error: Optional[grpc.RpcError], response=None) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            self._error, self._response = error, response
            self._core.finish()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._listening:
                self._listening = False
                self._attempts.subchannels.remove_listener(self._on_change)
            self._done.set()
            call_callbacks, self._call_callbacks = self._call_callbacks, []
            done_callbacks, self._done_callbacks = self._done_callbacks, []
        self._registry.discard(self)
        for callback in call_callbacks:
            _run_callback(callback)
        for callback in done_callbacks:
            _run_callback(callback, self)
        return True

    def _fail_local(self, code: grpc.StatusCode, details: str) -> None:
        attempt = self._attempt
        if self._finish(local_error(code, details)) and attempt is not None:
            attempt.cancel()

    def _on_change(self) -> None:  # UnaryFuture: the subchannels changed while it waited
        pass

    def _final_error(self, error: grpc.RpcError) -> grpc.RpcError:
        previous = self._core.attempts - 1
        return error if previous == 0 else RpcError.from_error(error, previous)

    # -- grpc.Future ----------------------------------------------------------------------------------

    def cancel(self) -> bool:
        if self._done.is_set():
            return False
        self._fail_local(grpc.StatusCode.CANCELLED, _CANCELLED_DETAILS)
        return True

    def cancelled(self) -> bool:
        """Cancelled by the application, as grpcio says (a channel's close ends calls CANCELLED, not cancelled)."""
        error = self._error
        return error is not None and error.code() == grpc.StatusCode.CANCELLED and error.details() == _CANCELLED_DETAILS

    def running(self) -> bool:
        return not self._done.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    def _wait(self, timeout):
        self._settle(timeout)
        if not self._done.wait(timeout):
            raise grpc.FutureTimeoutError()

    def _settle(self, timeout):  # streaming calls drive here; unary futures run on their own
        pass

    def result(self, timeout=None):
        self._wait(timeout)
        if self._error is not None:
            if self.cancelled():
                raise grpc.FutureCancelledError()
            raise self._error
        return self._response

    def exception(self, timeout=None):
        self._wait(timeout)
        if self.cancelled():
            raise grpc.FutureCancelledError()
        return self._error

    def traceback(self, timeout=None):
        error = self.exception(timeout)
        return None if error is None else error.__traceback__

    def add_done_callback(self, fn) -> None:
        with self._lock:
            if not self._done.is_set():
                self._done_callbacks.append(fn)
                self._need_driver()
                return
        fn(self)

    def _need_driver(self):
        pass

    # -- grpc.Call / RpcContext -----------------------------------------------------------------------

    def is_active(self) -> bool:
        return not self._done.is_set()

    def time_remaining(self) -> Optional[float]:
        deadline = self._core.deadline
        return None if deadline == _INF else max(0.0, deadline - monotonic())

    def add_callback(self, callback) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            self._call_callbacks.append(callback)
            self._need_driver()
            return True

    def initial_metadata(self):
        self._wait(None)
        return self._error.initial_metadata() if self._error is not None else self._attempt.initial_metadata()

    def trailing_metadata(self):
        self._wait(None)
        if self._error is not None:
            return self._error.trailing_metadata()
        previous = self._core.attempts - 1
        trailing = self._attempt.trailing_metadata()
        return trailing if previous == 0 else with_attempts(trailing, previous)

    def code(self):
        self._wait(None)
        return self._error.code() if self._error is not None else grpc.StatusCode.OK

    def details(self):
        self._wait(None)
        return self._error.details() if self._error is not None else self._attempt.details()


def _run_callback(callback, *args):
    try:
        callback(*args)
    except Exception:
        log.exception("callback of a grpc_retry call failed")


class UnaryFuture(_CallBase):
    """future() of unary-response calls: attempts end in grpc callbacks, backoff on the timer thread, waits for
    a subchannel on a change listener (and a deadline timer)."""

    def __init__(self, attempts: Attempts, registry):
        super().__init__(attempts, registry)
        with self._lock:
            self._start()

    def _start(self):
        """Start the next attempt, or end the call, or arrange to come back when the subchannels change
        (under self._lock)."""
        attempts = self._attempts
        while not self._done.is_set():
            step = attempts.next()
            if step.__class__ is not int:
                multicallable, kwargs = step
                attempt = self._attempt = multicallable.future(attempts.payload(), **kwargs)
                attempt.add_done_callback(self._on_attempt_done)
                return
            error = attempts.ending(step)
            if error is not None:
                self._finish(error)
                return
            if attempts.subchannels.when_changed(attempts.since, self._on_change):
                self._listening = True
                deadline = self._core.deadline
                if deadline != _INF:
                    self._timer = TIMERS.schedule(deadline - monotonic(), self._on_change)
                return
            # they changed while we looked: look again

    def _on_change(self):
        with self._lock:
            if not self._listening:
                return
            self._listening = False
            self._attempts.subchannels.remove_listener(self._on_change)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._attempts.closed():
                self._finish(local_error(grpc.StatusCode.CANCELLED, _CLOSED_DETAILS))
            else:
                self._start()

    def _retry(self):
        with self._lock:
            self._timer = None
            if not self._done.is_set():
                self._start()

    def _on_attempt_done(self, attempt):
        with self._lock:
            if self._done.is_set() or attempt is not self._attempt:
                return
            core = self._core
            error = attempt.exception()
            if error is None:
                core.on_status(0, None, 0.0)
                try:
                    response = self._attempts.deserialize(attempt.result())
                except Exception:
                    log.exception("response deserializer failed")
                    self._finish(local_error(grpc.StatusCode.INTERNAL, "Exception deserializing response!"))
                    return
                self._finish(None, response)
                return
            requests = self._attempts.requests
            if requests is not None and requests.failed:
                return  # the request iterator's failure already ended the call
            self._attempts.error = error
            if self._attempts.transparent(error.code(), error.details()):
                self._start()
                return
            if error.initial_metadata():
                core.on_headers()
            if core.on_status(error.code().value[0], error.trailing_metadata(), monotonic()) == RETRY:
                self._timer = TIMERS.schedule(core.delay, self._retry)
                return
            self._finish(self._final_error(error))


class ResponseIterator:
    """The response-stream side of a call (mixin over _CallBase): once an attempt has answered (or the call
    ended), the application's thread reads that attempt, and its end is the call's end."""

    __slots__ = ()

    def _ready_to_read(self) -> None:  # drive, or wait, until an attempt answered or the call ended
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self):
        self._ready_to_read()
        if self._done.is_set() and self._error is not None:
            raise self._error
        attempt = self._attempt
        try:
            message = self._peeked
            if message is None:
                message = next(attempt)
            else:
                self._peeked = None
        except StopIteration:
            self._finish_attempt(attempt)
            if self._error is not None:
                raise self._error from None
            raise
        except grpc.RpcError as error:
            if not (error.code() == grpc.StatusCode.CANCELLED and self._done.is_set()):
                self._finish_attempt(attempt)  # grpcio's call object is the error: its status ends the call
            raise self._error from None
        try:
            return self._attempts.deserialize(message)
        except Exception:
            log.exception("response deserializer failed")
            self._fail_local(grpc.StatusCode.INTERNAL, "Exception deserializing response!")
            raise self._error from None

    next = __next__


class StreamingCall(ResponseIterator, _CallBase):
    """Response-streaming calls: an iterator that is also a grpc.Call and a grpc.Future, as grpcio's.

    The reading thread drives: until an attempt answers (a response message, or headers that carry metadata),
    it runs attempts, transparent retries and backoff; the answer commits the call to that attempt. A call that
    commits from the start (no retry policy) is driven the same way, for its transparent retries. An attempt
    that ends unanswered is decided once (_attempt_over), by the reader or by grpcio's callback."""

    def __init__(self, attempts: Attempts, registry):
        super().__init__(attempts, registry)
        self._drive_lock = threading.Lock()
        self._wake = threading.Event()     # set when the call ends: cuts a backoff short
        self._waiting: Optional[threading.Event] = None  # the reader's wait for a subchannel, ditto
        self._peeked = None
        self._answered = False   # the current attempt answered: the server's application saw it
        self._decided = None     # the ended attempt whose fate was decided
        self._start(block=False)

    def _start(self, block: bool) -> bool:
        """Start the next attempt (True), or end the call (False). When no subchannel can take it: the
        reading thread (block) waits for one; otherwise the call is left without an attempt, for whoever
        reads it to drive."""
        attempts = self._attempts
        with self._lock:
            self._attempt = None
            self._answered = False
        while not self._done.is_set():
            step = attempts.next()
            if step.__class__ is not int:
                multicallable, kwargs = step
                with self._lock:
                    if self._done.is_set():
                        return False
                    self._attempt = multicallable(attempts.payload(), **kwargs)
                return True
            error = attempts.ending(step)
            if error is not None:
                self._finish(error)
                return False
            if not block:
                return False
            waiting = self._waiting = threading.Event()
            if self._done.is_set():
                return False
            attempts.wait(waiting)
            self._waiting = None
            if attempts.closed():
                self._fail_local(grpc.StatusCode.CANCELLED, _CLOSED_DETAILS)
        return False

    def _drive(self):
        """Run attempts until one answers or the call ends. An attempt answers with its first response
        message, or with headers that carry metadata; one that ends before either is taken as Trailers-Only
        (grpcio cannot tell an empty header frame apart, and timing would be a guess)."""
        with self._drive_lock:
            while not self._done.is_set() and not self._answered:
                attempt = self._attempt
                if attempt is None:
                    self._start(block=True)
                    continue
                try:
                    self._peeked = next(attempt)
                    self._answer(attempt)
                    break
                except (StopIteration, grpc.RpcError):
                    pass
                if self._done.is_set():
                    break
                if attempt.initial_metadata():
                    self._answer(attempt)
                    break
                self._attempt_over(attempt, block=True)

    def _answer(self, attempt):
        with self._lock:
            if attempt is self._attempt:
                self._answered = True
                self._core.on_headers()

    def _attempt_over(self, attempt, block: bool) -> None:
        """`attempt` ended unanswered: retry it (transparently, or after backoff) or end the call with its
        status. Only the first caller for an attempt decides. Without `block` (grpcio's callback thread) the
        next attempt starts only if it can at once."""
        core = self._core
        with self._lock:
            if self._done.is_set() or attempt is not self._attempt or self._decided is attempt:
                return
            self._decided = attempt
            requests = self._attempts.requests
            if requests is not None and requests.failed:
                return  # the request iterator's failure already ended the call
            code = attempt.code()
            delay = 0.0
            if code != _OK:
                self._attempts.error = attempt  # grpcio's call object is its own RpcError
            if code == _OK or not self._attempts.transparent(code, attempt.details()):
                if core.on_status(code.value[0], attempt.trailing_metadata(), monotonic()) != RETRY:
                    self._finish_attempt(attempt)
                    return
                delay = core.delay
            if not block:
                if delay > 0:
                    self._timer = TIMERS.schedule(delay, self._start_from_callback)
                else:
                    self._start_from_callback()
                return
        if delay > 0:
            self._wake.wait(delay)
        self._start(block=True)

    def _start_from_callback(self):
        with self._lock:
            self._timer = None
            if self._done.is_set():
                return
            self._start(block=False)
            self._need_driver()  # somebody waits for the end: follow the new attempt too

    def _attempt_ended(self, attempt):
        """grpcio's callback on an attempt that somebody waits on (add_done_callback)."""
        with self._lock:
            if self._done.is_set() or attempt is not self._attempt:
                return
            if self._answered:
                self._finish_attempt(attempt)
                return
        self._attempt_over(attempt, block=False)

    def _finish_attempt(self, attempt):
        """End with the (ended) committed attempt's status, which the throttle counts as every call's end."""
        code = attempt.code()
        self._core.on_status(code.value[0], attempt.trailing_metadata(), monotonic())  # no-op once decided
        if code == grpc.StatusCode.OK:
            self._finish(None)
        else:
            self._finish(self._final_error(RpcError(code, attempt.details(), attempt.initial_metadata(),
                                                    attempt.trailing_metadata(),
                                                    getattr(attempt, "debug_error_string", lambda: None)())))

    def _settle(self, timeout):
        self._drive()
        if not self._done.is_set():
            attempt = self._attempt
            attempt.code()  # blocks until the committed attempt ends
            self._finish_attempt(attempt)

    def _need_driver(self):
        attempt = self._attempt
        if attempt is not None and (self._answered or self._core.committed):
            # Its end decides the call (or, unanswered, a transparent retry): grpcio's callback will do.
            def callback():
                self._attempt_ended(attempt)

            if not attempt.add_callback(callback):
                TIMERS.schedule(0.0, callback)  # already over: not under the caller's lock
        else:
            # Nobody reads yet somebody waits for the end: drive it on a short-lived thread (rare).
            threading.Thread(target=self._settle, args=(None,), daemon=True,
                             name="grpc_retry-stream-driver").start()

    def _fail_local(self, code: grpc.StatusCode, details: str) -> None:
        super()._fail_local(code, details)
        self._wake.set()
        waiting = self._waiting
        if waiting is not None:
            waiting.set()

    _ready_to_read = _drive

    def initial_metadata(self):
        attempt = self._attempt
        if self._core.committed and not self._answered and attempt is not None:
            # As grpcio: headers as soon as they come, without waiting for a message. Only an attempt that
            # ended without any goes through the driver (it may be retried transparently).
            metadata = attempt.initial_metadata()
            if metadata or attempt.is_active():
                return metadata
        self._drive()
        if self._done.is_set() and self._error is not None:
            return self._error.initial_metadata()
        return self._attempt.initial_metadata()

    def debug_error_string(self):
        self._wait(None)
        return getattr(self._error, "debug_error_string", lambda: None)()
