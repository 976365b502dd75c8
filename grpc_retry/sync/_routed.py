"""The methods of a synchronous channel whose calls take a route each (its router: _backends/routers.py): each call
takes the route its method and metadata match, and the cluster that route gives it; its attempts then run as on
any other channel (the channel's own multicallable, made per cluster and route policy), on that cluster's
subchannels, under the route's retry policy (else the channel's service config).

A call made before the router's first config waits for it (at most its timeout), as grpcio's calls wait for their
resolver: a blocking call on its thread; a future or a response stream is returned at once (_Pending)."""

from __future__ import annotations

import math
import threading
from time import monotonic
from typing import Any, Callable, Iterator, List, Optional, Tuple

import grpc

from grpc_retry import _bases as bases
from grpc_retry._driver import CANCELLED_DETAILS, CLOSED_DETAILS, DEADLINE_DETAILS
from grpc_retry._method import Compression, Credentials, Metadata
from grpc_retry._routing import RoutedMethod, RouteError, bounded, start_failed
from grpc_retry._timer import TIMERS
from grpc_retry.sync._status import CLOSED_CHANNEL, RpcError, local_error

INF = math.inf


_STREAMS = ("unary_stream", "stream_stream")  # a response stream: the call object is its iterator too


class _Routed(RoutedMethod):
    __slots__ = ()

    def _route(self, metadata: Metadata, wait_for_ready: bool) -> Any:
        """The call's method, its cluster's admission (the call admitted) and time limit; None before the first
        config (a call that waits for ready: before a config, through errors); or the RpcError the call fails
        with."""
        if self._channel._state.closed:
            raise ValueError(CLOSED_CHANNEL)
        try:
            return self.admitted(metadata, wait_for_ready)
        except RouteError as error:
            return self._failed(grpc.StatusCode.UNAVAILABLE, str(error))

    def _failed(self, code: grpc.StatusCode, details: str) -> RpcError:
        """The call's end before it started: a frozen error (for a response stream, one that iterates)."""
        return (_FailedStream if self._kind in _STREAMS else RpcError)(code, details)

    def _call(self, name: str, request: Any, timeout: Optional[float], metadata: Metadata,
              credentials: Credentials, wait_for_ready: Optional[bool], compression: Compression) -> Any:
        """The method's `name` ("__call__", "with_call", "future"). Before the first config a blocking call waits
        for it on its thread; a future or a stream is a _Pending call at once. A blocking call raises the error
        its route ends it with; the others return it (a frozen error is a finished future and call too)."""
        started = monotonic()
        routed = self._route(metadata, bool(wait_for_ready))
        blocking = name != "future" and self._kind in ("unary_unary", "stream_unary")
        if routed is None:
            if not blocking:
                return _Pending(self, name, request, timeout, metadata, credentials, wait_for_ready, compression)
            router = self._channel._router
            while routed is None:  # (None again: the config was lost meanwhile, and the call waits for the next)
                left = None if timeout is None else timeout - (monotonic() - started)
                if not router.wait(left, bool(wait_for_ready)):
                    raise local_error(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)  # grpcio's words
                if router.closed:
                    raise local_error(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
                routed = self._route(metadata, bool(wait_for_ready))
        if isinstance(routed, RpcError):
            if blocking:
                raise routed
            return routed
        if timeout is not None:
            timeout = max(0.0, timeout - (monotonic() - started))
        return self._start(name, routed, request, timeout, metadata, credentials, wait_for_ready, compression)

    def _start(self, name: str, routed: Tuple[Any, Any, Optional[float]], request: Any, timeout: Optional[float],
               metadata: Metadata, credentials: Credentials, wait_for_ready: Optional[bool],
               compression: Compression) -> Any:
        """The call on its cluster's method; the cluster's admission is released when it ends."""
        method, admission, limit = routed
        timeout = bounded(timeout, limit)
        if name != "future" and self._kind in ("unary_unary", "stream_unary"):
            try:
                return getattr(method, name)(request, timeout, metadata, credentials, wait_for_ready, compression)
            finally:
                admission.release()
        try:
            call = getattr(method, name)(request, timeout, metadata, credentials, wait_for_ready, compression)
        except BaseException:
            admission.release()
            raise
        call.add_done_callback(admission.release)
        return call


class _FailedStream(RpcError):
    """A response stream that ended before it started: iterating it raises its status, as grpcio's does."""

    def __iter__(self) -> _FailedStream:
        return self

    def __next__(self) -> Any:
        raise self

    next = __next__


class _Pending(grpc.Call, grpc.Future):  # type: ignore[type-arg]
    """A future or response stream made before its channel's first config: it becomes its call when the config
    comes (on the router's thread), or ends with the error that came instead, its deadline, its cancel or the
    channel's close. Until then, what needs the call waits for it."""

    def __init__(self, routed: _Routed, name: str, request: Any, timeout: Optional[float], metadata: Metadata,
                 credentials: Credentials, wait_for_ready: Optional[bool], compression: Compression) -> None:
        self._routed, self._name, self._request = routed, name, request
        self._args = (metadata, credentials, wait_for_ready, compression)
        self._deadline = INF if timeout is None else monotonic() + timeout
        self._lock = threading.Lock()
        self._became = threading.Event()
        self._target: Any = None  # the call it became, or the RpcError it ended with
        self._done_callbacks: List[Callable[[Any], None]] = []
        self._call_callbacks: List[Callable[[], None]] = []
        self._timer = None if timeout is None else TIMERS.schedule(timeout, self._late, shared=True)
        if not routed._channel._router.when_ready(self._ready, bool(wait_for_ready)):
            self._ready()

    def _late(self) -> None:
        self._become(local_error(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS))

    def _ready(self) -> None:
        """A config (or an error) came, or the channel closed: start the call, or end. Never raises: it runs on the
        router's thread, in turn with every other call waiting for the config."""
        try:
            self._begin()
        except Exception as error:  # (its start raised, too late to raise where the call was made)
            self._become(local_error(*start_failed(error, self._routed._channel)))

    def _begin(self) -> None:
        if self._became.is_set():
            return
        router, metadata = self._routed._channel._router, self._args[0]
        if router.closed:
            self._become(local_error(grpc.StatusCode.CANCELLED, CLOSED_DETAILS))
            return
        routed = self._routed._route(metadata, bool(self._args[2]))
        while routed is None:  # the config was lost before this ran: wait for the next
            if router.when_ready(self._ready, bool(self._args[2])):
                return
            routed = self._routed._route(metadata, bool(self._args[2]))
        if isinstance(routed, RpcError):
            self._become(routed)
            return
        timeout = None if self._deadline == INF else max(0.0, self._deadline - monotonic())
        call = self._routed._start(self._name, routed, self._request, timeout, *self._args)
        if not self._become(call):
            call.cancel()  # (ended meanwhile: its deadline, or a cancel)

    def _become(self, target: Any) -> bool:
        with self._lock:
            if self._target is not None:
                return False
            if isinstance(target, RpcError) and self._routed._kind in _STREAMS:
                target = _FailedStream(target.code(), target.details())
            self._target = target
            done, self._done_callbacks = self._done_callbacks, []
            told, self._call_callbacks = self._call_callbacks, []
        if self._timer is not None:
            self._timer.cancel()
        self._became.set()
        for fn in done:
            target.add_done_callback(lambda _, fn=fn: fn(self))
        for callback in told:
            if not target.add_callback(callback):
                callback()  # (it had ended already: told all the same, as promised when it was added)
        return True

    def _call(self, timeout: Optional[float] = None) -> Any:
        if not self._became.wait(timeout):
            raise grpc.FutureTimeoutError()
        return self._target

    def _within(self, name: str, timeout: Optional[float]) -> Any:
        """The call's future method `name`, given what is left of `timeout` once the call exists."""
        started = monotonic()
        call = self._call(timeout)
        return getattr(call, name)(None if timeout is None else max(0.0, timeout - (monotonic() - started)))

    # -- grpc.Future --------------------------------------------------------------------------------------------

    def cancel(self) -> bool:
        if self._target is None and self._become(local_error(grpc.StatusCode.CANCELLED, CANCELLED_DETAILS)):
            return True
        return bool(self._target.cancel())

    def cancelled(self) -> bool:
        return self._target is not None and bool(self._target.cancelled())

    def running(self) -> bool:
        return not self.done()

    def done(self) -> bool:
        return self._target is not None and bool(self._target.done())

    def result(self, timeout: Optional[float] = None) -> Any:
        return self._within("result", timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[Exception]:
        return self._within("exception", timeout)  # type: ignore[no-any-return]

    def traceback(self, timeout: Optional[float] = None) -> Any:
        return self._within("traceback", timeout)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if self._target is None:
                self._done_callbacks.append(fn)
                return
        self._target.add_done_callback(lambda _: fn(self))

    # -- grpc.Call ----------------------------------------------------------------------------------------------

    def is_active(self) -> bool:
        return self._target is None or bool(self._target.is_active())

    def time_remaining(self) -> Optional[float]:  # type: ignore[override]  # grpcio's is Optional
        if self._target is not None:
            return self._target.time_remaining()  # type: ignore[no-any-return]
        return None if self._deadline == INF else max(0.0, self._deadline - monotonic())

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if self._target is None:
                self._call_callbacks.append(callback)
                return True
        return bool(self._target.add_callback(callback))

    def initial_metadata(self) -> Any:
        return self._call().initial_metadata()

    def trailing_metadata(self) -> Any:
        return self._call().trailing_metadata()

    def code(self) -> Any:
        return self._call().code()

    def details(self) -> Any:
        return self._call().details()

    def debug_error_string(self) -> Any:
        return self._call().debug_error_string()

    # -- a response stream --------------------------------------------------------------------------------------

    def __iter__(self) -> _Pending:
        return self

    def __next__(self) -> Any:
        return next(self._call())

    next = __next__


class UnaryUnary(_Routed, bases.UnaryUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call("__call__", request, timeout, metadata, credentials, wait_for_ready, compression)

    def with_call(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                  credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                  compression: Compression = None) -> Any:
        return self._call("with_call", request, timeout, metadata, credentials, wait_for_ready, compression)

    def future(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
               credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
               compression: Compression = None) -> Any:
        return self._call("future", request, timeout, metadata, credentials, wait_for_ready, compression)


class UnaryStream(_Routed, bases.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call("__call__", request, timeout, metadata, credentials, wait_for_ready, compression)


class StreamUnary(_Routed, bases.StreamUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call("__call__", request_iterator, timeout, metadata, credentials, wait_for_ready, compression)

    def with_call(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                  credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                  compression: Compression = None) -> Any:
        return self._call("with_call", request_iterator, timeout, metadata, credentials, wait_for_ready,
                          compression)

    def future(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
               credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
               compression: Compression = None) -> Any:
        return self._call("future", request_iterator, timeout, metadata, credentials, wait_for_ready, compression)


class StreamStream(_Routed, bases.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call("__call__", request_iterator, timeout, metadata, credentials, wait_for_ready, compression)
