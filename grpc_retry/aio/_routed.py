"""The methods of an asyncio channel whose calls take a route each (the sync one's twin, sync/_routed.py): each call
takes the route its method and metadata match and the cluster that route gives it; its attempts then run as on
any other channel, on that cluster's subchannels, under the route's retry policy (else the channel's service
config).

The router applies a config on the channel's event loop. A call made before the first config is a `_Pending` call: the
application has its call object at once, and the call starts when the config comes (or ends with the error that
came instead, or at its deadline)."""

from __future__ import annotations

import asyncio
import math
from time import monotonic
from typing import Any, AsyncIterator, Callable, Dict, Generator, List, Optional, Tuple

import grpc
from grpc import aio

from grpc_retry import _bases as bases
from grpc_retry._driver import CANCELLED_DETAILS, CLOSED_DETAILS, DEADLINE_DETAILS
from grpc_retry._method import Compression, Credentials, Metadata
from grpc_retry._routing import RoutedMethod, RouteError, bounded, start_failed

INSECURE_CALL_CREDENTIALS = "Call credentials are only valid on secure channels"  # grpcio's words



class _Routed(RoutedMethod):
    __slots__ = ()

    def _route(self, metadata: Metadata, wait_for_ready: bool) -> Any:
        """The call's method and its cluster's admission, the call admitted; None before the first config (or
        error: a call that waits for ready waits through those, as grpcio's does). RouteError: it cannot be sent."""
        return self.admitted(metadata, wait_for_ready)

    @staticmethod
    def _start(routed: Tuple[Any, Any, Optional[float]], request: Any, timeout: Optional[float], metadata: Metadata,
               credentials: Credentials, wait_for_ready: Optional[bool], compression: Compression) -> Any:
        """The call, on its cluster's method; the cluster's admission is released when it ends."""
        method, admission, limit = routed
        try:
            call = method(request, timeout=bounded(timeout, limit), metadata=metadata, credentials=credentials,
                          wait_for_ready=wait_for_ready, compression=compression)
        except BaseException:
            admission.release()
            raise
        call.add_done_callback(admission.release)
        return call

    def __call__(self, request: Any = None, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        if self._channel._state.closed:
            raise aio.UsageError("Channel is closed.")
        if credentials is not None and not self._channel._secure and not self._channel._interceptors[self._kind]:
            # grpcio checks the channel's credentials as the call is made, config or not (with interceptors, as
            # their continuation makes it: the cluster's method does that, and the call fails with it).
            raise aio.UsageError(INSECURE_CALL_CREDENTIALS)
        args = (timeout, metadata, credentials, wait_for_ready, compression)
        try:
            routed = self._route(metadata, bool(wait_for_ready))
        except RouteError as error:
            return _PENDING[self._kind](self, request, args, str(error))
        if routed is None:
            return _PENDING[self._kind](self, request, args, None)
        return self._start(routed, request, *args)


class UnaryUnary(_Routed, bases.AioUnaryUnaryMultiCallable):
    __slots__ = ()


class UnaryStream(_Routed, bases.AioUnaryStreamMultiCallable):
    __slots__ = ()


class StreamUnary(_Routed, bases.AioStreamUnaryMultiCallable):
    __slots__ = ()


class StreamStream(_Routed, bases.AioStreamStreamMultiCallable):
    __slots__ = ()


class _Pending:
    """A call made before its channel's first config, or one no route takes (`error`): the application's call
    object, whose every method waits for the call it becomes."""

    def __init__(self, routed: _Routed, request: Any, args: Tuple[Any, ...], error: Optional[str]) -> None:
        timeout = args[0]
        self._deadline = math.inf if timeout is None else monotonic() + timeout
        self._call: Any = None
        self._error: Optional[aio.AioRpcError] = None
        self._cancelled = False
        self._callbacks: List[Callable[[Any], None]] = []
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] = loop.create_future()  # it became a call, or ended
        self._woken: asyncio.Future[None] = loop.create_future()  # the config came, or the call was cancelled
        if error is not None:
            self._fail(grpc.StatusCode.UNAVAILABLE, error)
            self._started.set_result(None)
            return
        self._task = loop.create_task(self._start(routed, request, args))

    def _wake(self) -> None:
        if not self._woken.done():
            self._woken.set_result(None)

    async def _start(self, routed: _Routed, request: Any, args: Tuple[Any, ...]) -> None:
        """Become the call once the config comes, or end; either way exactly once, whatever raised meanwhile."""
        try:
            await self._become(routed, request, args)
        except Exception as error:  # (its start raised, too late to raise where the call was made)
            if self._call is None:
                self._fail(*start_failed(error, routed._channel))
        finally:
            if self._call is None and self._error is None:  # the task was cancelled: its loop is ending
                self._fail(grpc.StatusCode.CANCELLED, CANCELLED_DETAILS)
            if not self._started.done():
                self._started.set_result(None)
            if self._call is None:
                for callback in self._callbacks:
                    callback(self)

    async def _become(self, routed: _Routed, request: Any, args: Tuple[Any, ...]) -> None:
        router, patient = routed._channel._router, bool(args[3])
        while self._error is None and not self._cancelled:
            if router.when_ready(self._wake, patient):
                left = self._deadline - monotonic()
                try:
                    await asyncio.wait_for(asyncio.shield(self._woken), None if left == math.inf else max(0.0, left))
                except asyncio.TimeoutError:
                    self._fail(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)  # grpcio's words
                    break
            if router.closed and self._error is None:
                self._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
            if self._error is not None or self._cancelled:
                break
            try:
                method = routed._route(args[1], patient)
            except RouteError as error:
                self._fail(grpc.StatusCode.UNAVAILABLE, str(error))
                break
            if method is None:  # the config was lost before this ran: wait for the next
                self._woken = asyncio.get_running_loop().create_future()
                continue
            timeout = None if self._deadline == math.inf else max(0.0, self._deadline - monotonic())
            self._call = routed._start(method, request, timeout, *args[1:])
            for callback in self._callbacks:
                self._call.add_done_callback(lambda _, cb=callback: cb(self))
            break

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        self._error = aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details, None)

    async def _ready(self) -> Any:
        """The call it became; its AioRpcError when it became none (cancelled: CANCELLED)."""
        await asyncio.shield(self._started)
        if self._call is not None:
            return self._call
        assert self._error is not None
        raise self._error

    async def _became(self) -> Any:
        """As _ready, for what raises as a call does: asyncio.CancelledError once cancelled."""
        try:
            return await self._ready()
        except aio.AioRpcError:
            if self._cancelled:
                raise asyncio.CancelledError() from None
            raise

    # -- grpc.aio.Call --------------------------------------------------------------------------------------

    def cancelled(self) -> bool:
        return self._call.cancelled() if self._call is not None else self._cancelled

    def done(self) -> bool:
        if self._call is not None:
            return bool(self._call.done())
        return self._cancelled or self._error is not None

    def time_remaining(self) -> Optional[float]:
        if self._call is not None:
            return self._call.time_remaining()  # type: ignore[no-any-return]
        return None if self._deadline == math.inf else max(0.0, self._deadline - monotonic())

    def cancel(self) -> bool:
        if self._call is not None:
            return bool(self._call.cancel())
        if self.done():
            return False
        self._cancelled = True
        self._error = aio.AioRpcError(grpc.StatusCode.CANCELLED, aio.Metadata(), aio.Metadata(),
                                      "Locally cancelled by application!", None)
        self._wake()
        return True

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._call is not None:
            self._call.add_done_callback(lambda _: callback(self))
        elif self.done():
            callback(self)
        else:
            self._callbacks.append(callback)

    async def initial_metadata(self) -> Any:
        try:
            return await (await self._ready()).initial_metadata()
        except aio.AioRpcError as error:
            return error.initial_metadata()

    async def trailing_metadata(self) -> Any:
        try:
            return await (await self._ready()).trailing_metadata()
        except aio.AioRpcError as error:
            return error.trailing_metadata()

    async def code(self) -> grpc.StatusCode:
        try:
            return await (await self._ready()).code()  # type: ignore[no-any-return]
        except aio.AioRpcError as error:
            return error.code()

    async def details(self) -> str:
        try:
            return await (await self._ready()).details()  # type: ignore[no-any-return]
        except aio.AioRpcError as error:
            return error.details() or ""

    async def debug_error_string(self) -> str:
        try:
            return await (await self._ready()).debug_error_string()  # type: ignore[no-any-return]
        except aio.AioRpcError as error:
            return error.debug_error_string() or ""

    async def wait_for_connection(self) -> None:
        await (await self._became()).wait_for_connection()

    # -- by cardinality ---------------------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Any]:
        return self._response().__await__()

    async def _response(self) -> Any:
        return await (await self._became())

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        async for response in await self._became():
            yield response

    async def read(self) -> Any:
        return await (await self._became()).read()

    async def write(self, request: Any) -> None:
        await (await self._became()).write(request)

    async def done_writing(self) -> None:
        await (await self._became()).done_writing()


class _PendingUnaryUnary(_Pending, bases.AioUnaryUnaryCall):
    pass


class _PendingUnaryStream(_Pending, bases.AioUnaryStreamCall):
    pass


class _PendingStreamUnary(_Pending, bases.AioStreamUnaryCall):
    pass


class _PendingStreamStream(_Pending, bases.AioStreamStreamCall):
    pass


_PENDING: Dict[str, Any] = {"unary_unary": _PendingUnaryUnary, "unary_stream": _PendingUnaryStream,
            "stream_unary": _PendingStreamUnary, "stream_stream": _PendingStreamStream}


class Clusters:
    """What the channel's close() closes (aio/_channel.py): every cluster's subchannels."""

    outliers = None  # (each cluster has its own detector)

    def __init__(self, router: Any, changed: asyncio.Event) -> None:
        self._router, self._changed = router, changed

    async def close(self, grace: Optional[float]) -> None:
        for closing in self._router.close(grace):
            await closing
        self._changed.set()
