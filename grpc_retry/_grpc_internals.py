"""Every use of grpcio's private internals, in one place: what the drivers need to know of an attempt without
blocking or waiting for a coroutine, and which grpcio's public API does not tell.

asyncio: grpc.aio runs a call's done callbacks inside the coroutine that sets its status, before a unary response
is returned; so a unary attempt's end is watched on its invocation task, and its status read from the Cython
call. Sync: a done callback runs on grpcio's own thread, where `initial_metadata()` can block that thread for
good (the headers it waits for are delivered by that very thread); so the driver peeks at the call's state.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Callable, Dict, Optional, Tuple, cast

from grpc import aio
from grpc._cython import cygrpc
from grpc.aio import _interceptor

Metadata = Tuple[Any, ...]  # (key, value) pairs

# -- asyncio ---------------------------------------------------------------------------------------------------


def aio_working_loop() -> asyncio.AbstractEventLoop:
    """The loop a grpc.aio channel made now binds to: the running one, or (outside a coroutine) grpc.aio's pick."""
    return cast(asyncio.AbstractEventLoop, cygrpc.get_working_loop())


def aio_unary_task(attempt: Any) -> asyncio.Task[Any]:
    """The task that ends with a unary-response attempt's response (bytes) or EOF."""
    return cast("asyncio.Task[Any]", attempt._call_response)


def aio_status(attempt: Any) -> Optional[Any]:
    """An ended attempt's status (code(), details(), trailing_metadata(), debug_error_string()), or None."""
    return attempt._cython_call._status


def aio_initial_metadata(attempt: Any) -> Tuple[Tuple[str, Any], ...]:
    return attempt._cython_call._initial_metadata or ()


def aio_locally_cancelled(attempt: Any) -> bool:
    return bool(attempt._cython_call.is_locally_cancelled())


async def aio_send(attempt: Any, data: bytes) -> bool:
    """Write bytes to a streaming attempt; False once it has ended. Not grpc.aio's write(): when a send fails
    because the server just ended the stream, write() overwrites the attempt's status with INTERNAL, hiding the
    (maybe retryable) status the server sent. Here the attempt keeps the status the server gave it."""
    if attempt.done():
        return False
    metadata_sent = attempt._metadata_sent
    if not metadata_sent.is_set():
        await metadata_sent.wait()
        if attempt.done():
            return False
    try:
        await attempt._cython_call.send_serialized_message(data)
    except cygrpc.InternalError:
        return False
    return True


async def aio_half_close(attempt: Any) -> None:
    if attempt.done():
        return
    metadata_sent = attempt._metadata_sent
    if not metadata_sent.is_set():
        await metadata_sent.wait()
        if attempt.done():
            return
    try:
        await attempt._cython_call.send_receive_close()
    except cygrpc.InternalError:
        pass


class AioCallBase:
    """A base of grpc_retry's aio calls. grpc.aio's close before 1.83 finds the calls to cancel by scanning every
    task's frame for a `self` that is a grpc.aio.Call, and raises on one with neither `_channel` nor
    `_cython_call`; a `_channel` that is no grpc.aio channel's makes it pass ours by (we cancel our own)."""

    __slots__ = ()
    _channel: Any = None


# grpc.aio's interceptor calls (their cancel, done callbacks and response wrapping are what users of interceptors
# see) with a grpc_retry call at the bottom of the chain. The chain itself is run here: grpcio runs it in a
# method in some releases and in a closure in others, so neither can be overridden across the range.


def _unary_response(self: Any, result: Any) -> Any:
    return result if isinstance(result, aio.UnaryUnaryCall) else _interceptor.UnaryUnaryCallResponse(result)


def _stream_response(call_class: type, iterator_class: type) -> Callable[[Any, Any], Any]:
    def wrap(self: Any, result: Any) -> Any:
        if not isinstance(result, call_class):  # an interceptor that returned an iterator of responses
            result = iterator_class(self._last_returned_call_from_interceptors, result)
        self._last_returned_call_from_interceptors = result
        return result
    return wrap


_INTERCEPTED: Dict[str, Tuple[type, str, Callable[[Any, Any], Any]]] = {
    "unary_unary": (_interceptor.InterceptedUnaryUnaryCall, "intercept_unary_unary", _unary_response),
    "unary_stream": (_interceptor.InterceptedUnaryStreamCall, "intercept_unary_stream",
                     _stream_response(aio.UnaryStreamCall, _interceptor.UnaryStreamCallResponseIterator)),
    "stream_unary": (_interceptor.InterceptedStreamUnaryCall, "intercept_stream_unary", lambda self, result: result),
    "stream_stream": (_interceptor.InterceptedStreamStreamCall, "intercept_stream_stream",
                      _stream_response(aio.StreamStreamCall, _interceptor.StreamStreamCallResponseIterator)),
}


def aio_intercepted(kind: str) -> type:
    """grpc.aio's intercepted call class for `kind`, made as `cls(multicallable, request, timeout, metadata,
    credentials, wait_for_ready, compression)`; the multicallable's `_make` makes the call at the bottom."""
    base, intercept, wrap = _INTERCEPTED[kind]

    class Intercepted(base):  # type: ignore[misc, valid-type]
        def __init__(self, multicallable: Any, request: Any, timeout: Optional[float], metadata: Any, credentials: Any,
                     wait_for_ready: Optional[bool], compression: Any) -> None:
            self._retry_multicallable = multicallable
            self._retry_compression = compression
            if not isinstance(metadata, aio.Metadata):  # interceptors get a grpc.aio.Metadata, as from grpc.aio
                metadata = aio.Metadata.from_tuple(tuple(metadata or ()))
            self._last_returned_call_from_interceptors = None
            super().__init__(multicallable._interceptors, request, timeout, metadata, credentials,
                             wait_for_ready, None, multicallable._method, None, None, asyncio.get_running_loop())

        async def _invoke(self, interceptors: Any, method: Any, timeout: Optional[float], metadata: Any,
                          credentials: Any, wait_for_ready: Optional[bool], request: Any, *serializers: Any) -> Any:
            async def run(index: int, details: Any, request: Any) -> Any:
                if index < len(interceptors):
                    result = await getattr(interceptors[index], intercept)(functools.partial(run, index + 1),
                                                                          details, request)
                    return wrap(self, result)
                call = self._retry_multicallable._make(request, details.timeout, details.metadata,
                                                       details.credentials, details.wait_for_ready,
                                                       self._retry_compression)
                self._last_returned_call_from_interceptors = call
                return call

            details = aio.ClientCallDetails(method, timeout, metadata, credentials, wait_for_ready)
            return await run(0, details, request)

        def time_remaining(self) -> Optional[float]:
            return None

    Intercepted.__name__ = Intercepted.__qualname__ = base.__name__
    return Intercepted


# -- sync ------------------------------------------------------------------------------------------------------


def sync_status(call: Any) -> Tuple[Any, Optional[str], Metadata, Optional[str], Metadata]:
    """An ended sync attempt's (code, details, trailing metadata, debug error string, initial metadata), read
    without blocking: grpcio's accessors each wait for their own field, and a call cancelled locally may never
    get some of them (its debug string, say)."""
    state = call._state
    return (state.code, _decode(state.details), tuple(state.trailing_metadata or ()),
            _decode(state.debug_error_string), tuple(state.initial_metadata or ()))


def sync_code(call: Any) -> Any:
    """An ended sync attempt's status code (a grpc.StatusCode), without blocking."""
    return call._state.code


def sync_wait_headers(call: Any) -> Tuple[Metadata, bool]:
    """Block (never on grpcio's own thread) until a sync attempt has its response headers or has ended:
    (the headers so far, whether it has ended)."""
    state = call._state
    with state.condition:
        while state.initial_metadata is None and state.code is None:
            state.condition.wait()
        return tuple(state.initial_metadata or ()), state.code is not None


def sync_wait_end(call: Any) -> None:
    state = call._state
    with state.condition:
        while state.code is None:
            state.condition.wait()


def sync_response(call: Any) -> Any:
    """The response of a sync unary attempt that ended OK."""
    return call._state.response


def sync_connectivity(channel: Any, try_to_connect: bool) -> int:
    """A sync grpcio channel's connectivity state (grpc.ChannelConnectivity's number); `try_to_connect` starts a
    connection if it is IDLE. grpcio's public way, subscribe(), starts a poller thread of grpcio's own."""
    return int(channel._channel.check_connectivity_state(try_to_connect))


def sync_watch_connectivity(channel: Any, last: int, timeout: float) -> bool:
    """Block until the channel's state differs from `last` (True) or `timeout` passes (False). Raises ValueError
    once the channel is closed. grpcio's close waits for a watch in progress to end."""
    return bool(channel._channel.watch_connectivity_state(last, time.time() + timeout).success)


def _decode(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return cast(Optional[str], value)
