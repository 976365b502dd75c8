"""grpc_retry.aio channels: grpc.aio.Channel's interface over a subchannel whose own retries are off. A channel
whose target has a router (an `xds:` target: _backends/routers.py) makes its methods routed (aio/_routed.py)."""

from __future__ import annotations

import asyncio
import logging
import math
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Sequence, Type

import grpc
from grpc import aio
from grpc.aio import (
    ClientInterceptor,
    StreamStreamClientInterceptor,
    StreamUnaryClientInterceptor,
    UnaryStreamClientInterceptor,
    UnaryUnaryClientInterceptor,
)

from grpc_retry import _bases as bases
from grpc_retry._backends import AioSubchannels
from grpc_retry._backends.routers import notes_for, router_for
from grpc_retry._channel_state import ChannelState
from grpc_retry._method import Compression, Credentials, Deserializer, Metadata, Method, RetryStatistics, Serializer
from grpc_retry._options import OptionsType
from grpc_retry._transport import completions
from grpc_retry._transport import transport as internals
from grpc_retry.aio import _routed
from grpc_retry.aio._call import StreamStreamCall, StreamUnaryCall, UnaryStreamCall, UnaryUnaryCall
from grpc_retry.aio._timers import CallTimers

log = logging.getLogger("grpc_retry")

_INF = math.inf


class _MultiCallable(Method):
    """One method of the channel: resolves its policy once, then makes calls."""

    __slots__ = ("_interceptors", "timers")
    ATTEMPTS = internals.AIO
    # A timed call's due timer may wait this many loop turns for completions queued before it (CallMachine.timer)
    FLUSH_TURNS = 4

    def __init__(self, channel: Channel, method: str, serializer: Serializer, deserializer: Deserializer, kind: str,
                 interceptors: List[ClientInterceptor]) -> None:
        super().__init__(channel._state, channel._subchannels, method, serializer, deserializer, kind,
                         getattr(channel, "_admission", None), getattr(channel, "_hashing", None),
                         getattr(channel, "_faults", None))
        self._interceptors = interceptors
        self.timers = channel._timers  # its calls' timers: the channel's


class UnaryUnaryMultiCallable(_MultiCallable, bases.AioUnaryUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, *, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        if self._interceptors:
            return _InterceptedUnaryUnary(self, request, timeout, metadata, credentials, wait_for_ready,
                                          compression)
        return self._make(request, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request: Any, timeout: Optional[float], metadata: Metadata, credentials: Credentials,
              wait_for_ready: Optional[bool], compression: Compression) -> Any:
        return UnaryUnaryCall(self, self._machine(timeout, wait_for_ready, True, metadata), self._serialize(request),
                                    metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(_MultiCallable, bases.AioUnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, *, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        if self._interceptors:
            return _InterceptedUnaryStream(self, request, timeout, metadata, credentials, wait_for_ready,
                                           compression)
        return self._make(request, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request: Any, timeout: Optional[float], metadata: Metadata, credentials: Credentials,
              wait_for_ready: Optional[bool], compression: Compression) -> Any:
        return UnaryStreamCall(self, self._machine(timeout, wait_for_ready, True, metadata), self._serialize(request),
                                     metadata, credentials, wait_for_ready, compression)


class StreamUnaryMultiCallable(_MultiCallable, bases.AioStreamUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Any = None, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        if self._interceptors:
            return _InterceptedStreamUnary(self, request_iterator, timeout, metadata, credentials,
                                           wait_for_ready, compression)
        return self._make(request_iterator, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request_iterator: Any, timeout: Optional[float], metadata: Metadata, credentials: Credentials,
              wait_for_ready: Optional[bool], compression: Compression) -> Any:
        return StreamUnaryCall(self, self._machine(timeout, wait_for_ready, False, metadata), request_iterator,
                                     self._serializer, metadata, credentials, wait_for_ready, compression)


class StreamStreamMultiCallable(_MultiCallable, bases.AioStreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Any = None, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        if self._interceptors:
            return _InterceptedStreamStream(self, request_iterator, timeout, metadata, credentials,
                                            wait_for_ready, compression)
        return self._make(request_iterator, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request_iterator: Any, timeout: Optional[float], metadata: Metadata, credentials: Credentials,
              wait_for_ready: Optional[bool], compression: Compression) -> Any:
        return StreamStreamCall(self, self._machine(timeout, wait_for_ready, False, metadata), request_iterator,
                                      self._serializer, metadata, credentials, wait_for_ready, compression)


# -- client interceptors ---------------------------------------------------------------------------------
# grpc.aio's interceptor calls, with a grpc_retry call at the bottom of the chain: interceptors see one logical
# call, not each attempt.

_InterceptedUnaryUnary = internals.aio_intercepted("unary_unary")
_InterceptedUnaryStream = internals.aio_intercepted("unary_stream")
_InterceptedStreamUnary = internals.aio_intercepted("stream_unary")
_InterceptedStreamStream = internals.aio_intercepted("stream_stream")


def _working_loop_soon() -> Callable[[Callable[[], None]], None]:
    """Where a router applies a config: on the loop a grpc.aio channel made now binds to, from any thread."""
    loop = internals.aio_working_loop()

    def soon(apply: Callable[[], None]) -> None:
        loop.call_soon_threadsafe(apply)
    return soon


def by_kind(interceptors: Optional[Sequence[ClientInterceptor]]) -> Dict[str, List[ClientInterceptor]]:
    """The channel's interceptors, per kind of method they serve."""
    kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
    chosen: Dict[str, List[ClientInterceptor]] = {kind: [] for kind in kinds}
    for interceptor in interceptors or ():
        # As grpc.aio: an interceptor serves the first of these kinds it is an instance of, only.
        for kind, cls in (("unary_unary", UnaryUnaryClientInterceptor),
                          ("unary_stream", UnaryStreamClientInterceptor),
                          ("stream_unary", StreamUnaryClientInterceptor),
                          ("stream_stream", StreamStreamClientInterceptor)):
            if isinstance(interceptor, cls):
                chosen[kind].append(interceptor)
                break
        else:
            raise ValueError(f"Interceptor {interceptor} must be UnaryUnaryClientInterceptor or "
                             "UnaryStreamClientInterceptor or StreamUnaryClientInterceptor or "
                             "StreamStreamClientInterceptor. ")
    return chosen


class Channel(RetryStatistics, aio.Channel):
    """A grpc.aio.Channel whose calls are retried by grpc_retry's core (gRFC A6)."""

    def __init__(self, target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression], interceptors: Optional[Sequence[ClientInterceptor]]) -> None:
        self._state = ChannelState(target, options)
        self._interceptors = by_kind(interceptors)
        self._secure = credentials is not None
        # Its calls' router, if its target has one (its configs applied on the channel's loop); else its own
        # subchannels.
        self._router: Any = router_for(target, self._state.options, credentials,
                                       lambda where, opts: AioSubchannels(where, opts, credentials, compression),
                                       _working_loop_soon)
        self._changed: Optional[asyncio.Event] = None  # (routed: set when the router's aggregate state may differ)
        if self._router is None:
            self._subchannels: Any = AioSubchannels(target, self._state.options, credentials, compression)
            self._subchannels.explain = notes_for(target, credentials)
            self._state.observe_backends(self._subchannels)
        else:
            self._changed = asyncio.Event()
            self._subchannels = _routed.Clusters(self._router, self._changed)
            self._router.watch(self._changed.set)
        self._timers = CallTimers()

    # -- multicallables ---------------------------------------------------------------------------------

    def unary_unary(self, method: str, request_serializer: Serializer = None,
                    response_deserializer: Deserializer = None,
                    _registered_method: Optional[bool] = False) -> bases.AioUnaryUnaryMultiCallable:
        if self._router is not None:
            return _routed.UnaryUnary(self, method, request_serializer, response_deserializer, "unary_unary",
                                      UnaryUnaryMultiCallable, self._interceptors["unary_unary"])
        return UnaryUnaryMultiCallable(self, method, request_serializer, response_deserializer, "unary_unary",
                                       self._interceptors["unary_unary"])

    def unary_stream(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None,
                     _registered_method: Optional[bool] = False) -> bases.AioUnaryStreamMultiCallable:
        if self._router is not None:
            return _routed.UnaryStream(self, method, request_serializer, response_deserializer, "unary_stream",
                                       UnaryStreamMultiCallable, self._interceptors["unary_stream"])
        return UnaryStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                        "unary_stream", self._interceptors["unary_stream"])

    def stream_unary(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None,
                     _registered_method: Optional[bool] = False) -> bases.AioStreamUnaryMultiCallable:
        if self._router is not None:
            return _routed.StreamUnary(self, method, request_serializer, response_deserializer, "stream_unary",
                                       StreamUnaryMultiCallable, self._interceptors["stream_unary"])
        return StreamUnaryMultiCallable(self, method, request_serializer, response_deserializer,
                                        "stream_unary", self._interceptors["stream_unary"])

    def stream_stream(self, method: str, request_serializer: Serializer = None,
                      response_deserializer: Deserializer = None,
                      _registered_method: Optional[bool] = False) -> bases.AioStreamStreamMultiCallable:
        if self._router is not None:
            return _routed.StreamStream(self, method, request_serializer, response_deserializer, "stream_stream",
                                        StreamStreamMultiCallable, self._interceptors["stream_stream"])
        return StreamStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                         "stream_stream", self._interceptors["stream_stream"])

    # -- connectivity and lifetime ----------------------------------------------------------------------

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        backends = self._subchannels if self._router is None else self._router
        if try_to_connect:
            backends.connect()
        return backends.aggregate_state()  # type: ignore[no-any-return]

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        router, changed = self._router, self._changed
        if router is not None and changed is not None:
            if router.closed:
                raise aio.UsageError("Channel is closed.")
            while router.aggregate_state() == last_observed_state and not router.closed:
                changed.clear()
                await changed.wait()
            return
        subchannels = self._subchannels
        if subchannels.closed:  # as grpc.aio's: a wait begun after close is a usage error (one in progress returns)
            raise aio.UsageError("Channel is closed.")
        while True:
            since = subchannels.generation  # before looking: a change from the resolver thread cannot slip by
            if subchannels.aggregate_state() != last_observed_state or subchannels.closed:
                return
            await subchannels.wait_change(None, since, use=False)

    async def channel_ready(self) -> None:
        state = self.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            await self.wait_for_state_change(state)
            state = self.get_state(try_to_connect=True)

    async def close(self, grace: Optional[float] = None) -> None:
        """As grpc.aio: new calls are refused at once; the calls in flight may run until `grace` ends, then
        are cancelled (with every timer and task of theirs); then the subchannels close."""
        state = self._state
        if state.closed:
            return
        if grace is not None and grace < 0:
            raise ValueError(f"grace must be non-negative, got {grace}.")
        state.close()
        await end_calls(list(state.calls), grace)
        self._timers.close()
        await self._subchannels.close(None)

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc_val: Optional[BaseException],
                        exc_tb: Optional[TracebackType]) -> None:
        await self.close(None)


def insecure_channel(target: str, options: OptionsType = None, compression: Optional[grpc.Compression] = None,
                     interceptors: Optional[Sequence[ClientInterceptor]] = None) -> Channel:
    """Like grpc.aio.insecure_channel, with grpc_retry doing the retries."""
    return _channel(target, options, None, compression, interceptors)


def secure_channel(target: str, credentials: grpc.ChannelCredentials, options: OptionsType = None,
                   compression: Optional[grpc.Compression] = None,
                   interceptors: Optional[Sequence[ClientInterceptor]] = None) -> Channel:
    """Like grpc.aio.secure_channel, with grpc_retry doing the retries."""
    if credentials is None:
        raise ValueError("secure_channel needs credentials")
    return _channel(target, options, credentials, compression, interceptors)


async def end_calls(calls: List[Any], grace: Optional[float]) -> None:
    """A closing channel's calls may run until `grace` ends; then they are cancelled."""
    if grace and calls:
        waits = [asyncio.ensure_future(call._until_done()) for call in calls]
        await asyncio.wait(waits, timeout=grace)
        for wait in waits:
            wait.cancel()
    for call in calls:
        call.cancel()


def _channel(target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
             compression: Optional[grpc.Compression], interceptors: Optional[Sequence[ClientInterceptor]]) -> Channel:
    completions.ensure("aio")  # once per process: grpcio completes attempts as the direct transport relies on
    return Channel(target, options, credentials, compression, interceptors)


__all__: Sequence[Any] = ["Channel", "insecure_channel", "secure_channel"]
