"""The synchronous driver: grpc's sync call objects over attempts that are plain grpc sync calls.

Blocking calls (`__call__`, `with_call`) run their attempts inline in the calling thread. Futures run on
attempt-done callbacks and the shared timer thread. Response iterators are driven by the thread that reads
them. No call holds a thread of its own (grpcio's own request-consumer thread per streaming attempt aside).
"""

from __future__ import annotations

import logging
import threading
from time import monotonic, sleep
from typing import Any, Callable, List, Optional

import grpc

from grpc_retry._core import RETRY, RetryCall
from grpc_retry._timer import TIMERS

log = logging.getLogger("grpc_retry")

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"
_INF = float("inf")
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_CANCELLED_DETAILS = "Locally cancelled by application!"
_DEADLINE_DETAILS = "Deadline Exceeded"


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

    def attempt_iterator(self):
        core = self._core
        sent = 0
        while True:
            with self._lock:
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
            if core.committed:
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
        self._core.add_message(data)
        return data

    def _fail(self, code, details):
        self.failed = True
        self._on_error(code, details)
        return None


class Attempts:
    """How one call starts its attempts on the subchannel (shared by the call objects below)."""

    __slots__ = ("core", "multicallable", "metadata", "credentials", "wait_for_ready", "compression",
                 "deserializer", "request", "requests", "closed")

    def __init__(self, core, multicallable, metadata, credentials, wait_for_ready, compression, deserializer,
                 closed: Callable[[], bool]):
        self.core = core
        self.multicallable = multicallable
        self.metadata = tuple(metadata) if metadata else ()
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression
        self.deserializer = deserializer
        self.request = None          # bytes, for unary requests
        self.requests: Optional[RequestSource] = None
        self.closed = closed

    def kwargs(self):
        """Keyword arguments for the next attempt, or None when the deadline has passed."""
        now = monotonic()
        previous = self.core.begin_attempt(now)
        if previous < 0:
            return None
        return dict(timeout=attempt_timeout(self.core, now), metadata=attempt_metadata(self.metadata, previous),
                    credentials=self.credentials, wait_for_ready=self.wait_for_ready,
                    compression=self.compression)

    def payload(self):
        return self.request if self.requests is None else self.requests.attempt_iterator()

    def deserialize(self, response):
        return response if self.deserializer is None else self.deserializer(response)


def blocking_call(attempts: Attempts, with_call: bool):
    """Run a unary-response call inline in the calling thread: attempts, backoff sleeps and all."""
    core = attempts.core
    while True:
        kwargs = attempts.kwargs()
        if kwargs is None:
            raise local_error(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
        try:
            response, call = attempts.multicallable.with_call(attempts.payload(), **kwargs)
        except grpc.RpcError as error:
            if attempts.requests is not None and attempts.requests.failed:
                core.finish()
                raise  # the caller replaces it with the request iterator's failure
            if error.initial_metadata():
                core.on_headers()
            if core.on_status(error.code().value[0], error.trailing_metadata(), monotonic()) == RETRY:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("call: attempt %d failed %s, retrying in %.3fs", core.attempts, error.code(),
                              core.delay)
                if core.delay > 0:
                    sleep(core.delay)
                if attempts.closed():
                    core.finish()
                    raise local_error(grpc.StatusCode.CANCELLED, "Channel closed!") from None
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
        return self._done.is_set() and self._error is not None and self._error.code() == grpc.StatusCode.CANCELLED

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
    """future() of unary-response calls: attempts end in grpc callbacks, backoff on the timer thread."""

    def __init__(self, attempts: Attempts, registry):
        super().__init__(attempts, registry)
        with self._lock:
            self._start()

    def _start(self):
        kwargs = self._attempts.kwargs()
        if kwargs is None:
            self._fail_local(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
            return
        attempt = self._attempt = self._attempts.multicallable.future(self._attempts.payload(), **kwargs)
        attempt.add_done_callback(self._on_attempt_done)

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
            if error.initial_metadata():
                core.on_headers()
            if core.on_status(error.code().value[0], error.trailing_metadata(), monotonic()) == RETRY:
                self._timer = TIMERS.schedule(core.delay, self._retry)
                return
            self._finish(self._final_error(error))


class StreamingCall(_CallBase):
    """Response-streaming calls: an iterator that is also a grpc.Call and a grpc.Future, as grpcio's.
    The reading thread drives: until a response's headers commit the call, it runs attempts and backoff."""

    def __init__(self, attempts: Attempts, registry):
        super().__init__(attempts, registry)
        self._drive_lock = threading.Lock()
        self._wake = threading.Event()
        self._peeked = None
        self._start()

    def _start(self) -> bool:
        kwargs = self._attempts.kwargs()
        if kwargs is None:
            self._fail_local(grpc.StatusCode.DEADLINE_EXCEEDED, _DEADLINE_DETAILS)
            return False
        with self._lock:
            if self._done.is_set():
                return False
            self._attempt = self._attempts.multicallable(self._attempts.payload(), **kwargs)
            return True

    def _drive_to_commit(self):
        """Run attempts until one commits or the call ends. An attempt commits with its first response
        message, or with headers that carry metadata; one that ends before either is taken as Trailers-Only
        (grpcio cannot tell an empty header frame apart, and timing would be a guess)."""
        core = self._core
        with self._drive_lock:
            while not self._done.is_set() and not core.committed:
                attempt = self._attempt
                try:
                    self._peeked = next(attempt)
                    core.on_headers()
                    break
                except (StopIteration, grpc.RpcError):
                    pass
                if self._done.is_set():
                    break
                if attempt.initial_metadata():
                    core.on_headers()
                    break
                requests = self._attempts.requests
                if requests is not None and requests.failed:
                    break  # the request iterator's failure already ended the call
                if core.on_status(attempt.code().value[0], attempt.trailing_metadata(), monotonic()) == RETRY:
                    if core.delay > 0:
                        self._wake.wait(core.delay)
                    if not self._done.is_set():
                        self._start()
                    continue
                self._finish_attempt(attempt)

    def _finish_attempt(self, attempt):
        """End with the (ended) committed attempt's status."""
        code = attempt.code()
        if code == grpc.StatusCode.OK:
            self._finish(None)
        else:
            self._finish(self._final_error(RpcError(code, attempt.details(), attempt.initial_metadata(),
                                                    attempt.trailing_metadata(),
                                                    getattr(attempt, "debug_error_string", lambda: None)())))

    def _settle(self, timeout):
        self._drive_to_commit()
        if not self._done.is_set():
            attempt = self._attempt
            attempt.code()  # blocks until the committed attempt ends
            self._finish_attempt(attempt)

    def _need_driver(self):
        if self._core.committed and self._attempt is not None:
            attempt = self._attempt
            attempt.add_callback(lambda: self._finish_attempt(attempt))
        else:
            # Nobody reads yet somebody waits for the end: drive it on a short-lived thread (rare).
            threading.Thread(target=self._settle, args=(None,), daemon=True,
                             name="grpc_retry-stream-driver").start()

    def cancel(self) -> bool:
        self._wake.set()
        return super().cancel()

    def __iter__(self):
        return self

    def __next__(self):
        self._drive_to_commit()
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
            if error.code() == grpc.StatusCode.CANCELLED and self._done.is_set():
                raise self._error from None
            self._finish(self._final_error(error))
            raise self._error from None
        try:
            return self._attempts.deserialize(message)
        except Exception:
            log.exception("response deserializer failed")
            self._fail_local(grpc.StatusCode.INTERNAL, "Exception deserializing response!")
            raise self._error from None

    next = __next__

    def initial_metadata(self):
        self._drive_to_commit()
        if self._done.is_set() and self._error is not None:
            return self._error.initial_metadata()
        return self._attempt.initial_metadata()

    def debug_error_string(self):
        self._wait(None)
        return getattr(self._error, "debug_error_string", lambda: None)()
