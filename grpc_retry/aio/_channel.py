"""grpc_retry.aio channels: grpc.aio.Channel's interface over a subchannel whose own retries are off."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Optional, Sequence

import grpc
from grpc.aio import Metadata, _base_channel
from grpc.aio._interceptor import (
    ClientInterceptor,
    InterceptedStreamStreamCall,
    InterceptedStreamUnaryCall,
    InterceptedUnaryStreamCall,
    InterceptedUnaryUnaryCall,
    StreamStreamClientInterceptor,
    StreamUnaryClientInterceptor,
    UnaryStreamClientInterceptor,
    UnaryUnaryClientInterceptor,
)

from grpc_retry._channel_state import ChannelState
from grpc_retry._method import Method, RetryStatistics
from grpc_retry._options import OptionsType
from grpc_retry._subchannels import AioSubchannels
from grpc_retry.aio import _call

log = logging.getLogger("grpc_retry")

_INF = math.inf


class _MultiCallable(Method):
    """One method of the channel: resolves its policy once, then makes calls."""

    __slots__ = ("_interceptors",)

    def __init__(self, channel: Channel, method: str, serializer, deserializer, kind: str, interceptors):
        super().__init__(channel._state, channel._subchannels, method, serializer, deserializer, kind)
        self._interceptors = interceptors


class UnaryUnaryMultiCallable(_MultiCallable, _base_channel.UnaryUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request, *, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        if self._interceptors:
            return _InterceptedUnaryUnary(self, request, timeout, metadata, credentials, wait_for_ready,
                                          compression)
        return self._make(request, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request, timeout, metadata, credentials, wait_for_ready, compression):
        return _call.UnaryUnaryCall(self, self._machine(timeout, wait_for_ready, True), self._serialize(request),
                                    metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(_MultiCallable, _base_channel.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request, *, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        if self._interceptors:
            return _InterceptedUnaryStream(self, request, timeout, metadata, credentials, wait_for_ready,
                                           compression)
        return self._make(request, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request, timeout, metadata, credentials, wait_for_ready, compression):
        return _call.UnaryStreamCall(self, self._machine(timeout, wait_for_ready, True), self._serialize(request),
                                     metadata, credentials, wait_for_ready, compression)


class StreamUnaryMultiCallable(_MultiCallable, _base_channel.StreamUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator=None, timeout=None, metadata=None, credentials=None,
                 wait_for_ready=None, compression=None):
        if self._interceptors:
            return _InterceptedStreamUnary(self, request_iterator, timeout, metadata, credentials,
                                           wait_for_ready, compression)
        return self._make(request_iterator, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request_iterator, timeout, metadata, credentials, wait_for_ready, compression):
        return _call.StreamUnaryCall(self, self._machine(timeout, wait_for_ready, False), request_iterator,
                                     self._serializer, metadata, credentials, wait_for_ready, compression)


class StreamStreamMultiCallable(_MultiCallable, _base_channel.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator=None, timeout=None, metadata=None, credentials=None,
                 wait_for_ready=None, compression=None):
        if self._interceptors:
            return _InterceptedStreamStream(self, request_iterator, timeout, metadata, credentials,
                                            wait_for_ready, compression)
        return self._make(request_iterator, timeout, metadata, credentials, wait_for_ready, compression)

    def _make(self, request_iterator, timeout, metadata, credentials, wait_for_ready, compression):
        return _call.StreamStreamCall(self, self._machine(timeout, wait_for_ready, False), request_iterator,
                                      self._serializer, metadata, credentials, wait_for_ready, compression)


# -- client interceptors ---------------------------------------------------------------------------------
# grpc.aio runs interceptors above its own call objects; we reuse its interceptor machinery and put a
# grpc_retry call at the bottom of the chain, so interceptors see one logical call, not each attempt.


def _terminal(base):
    class Intercepted(base):
        def __init__(self, multicallable, request, timeout, metadata, credentials, wait_for_ready,
                     compression):
            self._retry_multicallable = multicallable
            self._retry_compression = compression
            if not isinstance(metadata, Metadata):  # interceptors get a grpc.aio.Metadata, as from grpc.aio
                metadata = Metadata.from_tuple(tuple(metadata or ()))
            super().__init__(multicallable._interceptors, request, timeout, metadata, credentials,
                             wait_for_ready, None, multicallable._method, None, None,
                             asyncio.get_running_loop())

        async def _run_interceptor(self, interceptors, method, request_serializer, response_deserializer,
                                   client_call_details, request):
            if interceptors:
                return await super()._run_interceptor(interceptors, method, request_serializer,
                                                      response_deserializer, client_call_details, request)
            details = client_call_details
            call = self._retry_multicallable._make(request, details.timeout, details.metadata,
                                                   details.credentials, details.wait_for_ready,
                                                   self._retry_compression)
            # What grpc.aio's response-stream interceptor calls wrap when an interceptor returns an iterator.
            self._last_returned_call_from_interceptors = call
            return call

        def time_remaining(self):
            return None

    Intercepted.__name__ = base.__name__
    return Intercepted


_InterceptedUnaryUnary = _terminal(InterceptedUnaryUnaryCall)
_InterceptedUnaryStream = _terminal(InterceptedUnaryStreamCall)
_InterceptedStreamUnary = _terminal(InterceptedStreamUnaryCall)
_InterceptedStreamStream = _terminal(InterceptedStreamStreamCall)


class Channel(RetryStatistics, _base_channel.Channel):
    """A grpc.aio.Channel whose calls are retried by grpc_retry's core (gRFC A6)."""

    def __init__(self, target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression], interceptors: Optional[Sequence[ClientInterceptor]]):
        self._state = ChannelState(target, options)
        self._interceptors = {kind: [] for kind in ("unary_unary", "unary_stream", "stream_unary",
                                                    "stream_stream")}
        for interceptor in interceptors or ():
            # As grpc.aio: an interceptor serves the first of these kinds it is an instance of, only.
            for kind, cls in (("unary_unary", UnaryUnaryClientInterceptor),
                              ("unary_stream", UnaryStreamClientInterceptor),
                              ("stream_unary", StreamUnaryClientInterceptor),
                              ("stream_stream", StreamStreamClientInterceptor)):
                if isinstance(interceptor, cls):
                    self._interceptors[kind].append(interceptor)
                    break
            else:
                raise ValueError(f"Interceptor {interceptor} must be UnaryUnaryClientInterceptor or "
                                 "UnaryStreamClientInterceptor or StreamUnaryClientInterceptor or "
                                 "StreamStreamClientInterceptor. ")
        self._subchannels = AioSubchannels(target, self._state.options, credentials, compression)

    # -- multicallables ---------------------------------------------------------------------------------

    def unary_unary(self, method: str, request_serializer=None, response_deserializer=None,
                    _registered_method: Optional[bool] = False) -> UnaryUnaryMultiCallable:
        return UnaryUnaryMultiCallable(self, method, request_serializer, response_deserializer, "unary_unary",
                                       self._interceptors["unary_unary"])

    def unary_stream(self, method: str, request_serializer=None, response_deserializer=None,
                     _registered_method: Optional[bool] = False) -> UnaryStreamMultiCallable:
        return UnaryStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                        "unary_stream", self._interceptors["unary_stream"])

    def stream_unary(self, method: str, request_serializer=None, response_deserializer=None,
                     _registered_method: Optional[bool] = False) -> StreamUnaryMultiCallable:
        return StreamUnaryMultiCallable(self, method, request_serializer, response_deserializer,
                                        "stream_unary", self._interceptors["stream_unary"])

    def stream_stream(self, method: str, request_serializer=None, response_deserializer=None,
                      _registered_method: Optional[bool] = False) -> StreamStreamMultiCallable:
        return StreamStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                         "stream_stream", self._interceptors["stream_stream"])

    # -- connectivity and lifetime ----------------------------------------------------------------------

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        if try_to_connect:
            self._subchannels.connect()
        return self._subchannels.aggregate_state()

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        subchannels = self._subchannels
        while True:
            since = subchannels.generation  # before looking: a change from the resolver thread cannot slip by
            if subchannels.aggregate_state() != last_observed_state or subchannels.closed:
                return
            await subchannels.wait_change(None, since)

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
        state.closed = True
        calls = list(state.calls)
        if grace and calls:
            waits = [asyncio.ensure_future(call._until_done()) for call in calls]
            await asyncio.wait(waits, timeout=grace)
            for wait in waits:
                wait.cancel()
        for call in calls:
            call.cancel()
        await self._subchannels.close(None)

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, exc_type, exc_val, exc_tb) -> None:
        await self.close(None)


def insecure_channel(target: str, options: OptionsType = None, compression: Optional[grpc.Compression] = None,
                     interceptors: Optional[Sequence[ClientInterceptor]] = None) -> Channel:
    """Like grpc.aio.insecure_channel, with grpc_retry doing the retries."""
    return Channel(target, options, None, compression, interceptors)


def secure_channel(target: str, credentials: grpc.ChannelCredentials, options: OptionsType = None,
                   compression: Optional[grpc.Compression] = None,
                   interceptors: Optional[Sequence[ClientInterceptor]] = None) -> Channel:
    """Like grpc.aio.secure_channel, with grpc_retry doing the retries."""
    if credentials is None:
        raise ValueError("secure_channel needs credentials")
    return Channel(target, options, credentials, compression, interceptors)


__all__: Sequence[Any] = ["Channel", "insecure_channel", "secure_channel"]
