"""A synchronous channel on an `xds:` target: each call takes the route its method and metadata match, and the
cluster that route gives it (_backends/xds/router.py); its attempts then run as on any other channel, on that
cluster's subchannels, under the route's retry policy (else the channel's service config).

A call made before the channel's first config waits for it (at most its timeout), as grpcio's calls wait for their
resolver: a blocking call on its thread, and so does the call that makes a future or a stream."""

from __future__ import annotations

import threading
from time import monotonic
from typing import Any, Iterator, List, Optional

import grpc

from grpc_retry import _bases as bases
from grpc_retry._backends import SyncSubchannels
from grpc_retry._backends.xds.router import RouteError, XdsRouter
from grpc_retry._channel_state import ChannelState
from grpc_retry._driver import CLOSED_DETAILS
from grpc_retry._method import Compression, Credentials, Deserializer, Metadata, Serializer
from grpc_retry._options import OptionsType
from grpc_retry._routing import RoutedMethod, bounded
from grpc_retry.sync._channel import (
    CLOSED_CHANNEL,
    Channel,
    StreamStreamMultiCallable,
    StreamUnaryMultiCallable,
    UnaryStreamMultiCallable,
    UnaryUnaryMultiCallable,
    _Subscription,
)
from grpc_retry.sync._status import RpcError, local_error
from grpc_retry.sync._workers import Workers

_NO_CONFIG = "xDS: no configuration for the target before the call's deadline"


class _Routed(RoutedMethod):
    __slots__ = ()

    def _for(self, timeout: Optional[float], metadata: Metadata, wait_for_ready: bool) -> Any:
        """The call's method and its cluster's Gate, admitted; or the RpcError the call fails with. A call that
        waits for ready waits for a config through the errors that come before it, as grpcio's does."""
        channel = self._channel
        if channel._state.closed:
            raise ValueError(CLOSED_CHANNEL)
        router = channel._router
        try:
            routed = router.route(self._method, metadata, wait_for_ready)
            if routed is None:
                if not router.wait(timeout, wait_for_ready):
                    return local_error(grpc.StatusCode.DEADLINE_EXCEEDED, _NO_CONFIG)
                if router.closed:
                    return local_error(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
                routed = router.route(self._method, metadata, wait_for_ready)
            assert routed is not None
            return self.method_of(routed)
        except RouteError as error:
            return local_error(grpc.StatusCode.UNAVAILABLE, str(error))

    def _call(self, name: str, request: Any, timeout: Optional[float], metadata: Metadata,
              credentials: Credentials, wait_for_ready: Optional[bool], compression: Compression) -> Any:
        """The method's `name` ("__call__", "with_call", "future"); a blocking call raises a route's error, the
        others return it (a frozen error is a finished future and call too). The cluster's gate is released when
        the call ends."""
        started = monotonic()
        routed = self._for(timeout, metadata, bool(wait_for_ready))
        blocking = name != "future" and self._kind in ("unary_unary", "stream_unary")
        if isinstance(routed, RpcError):
            if blocking:
                raise routed
            return routed
        method, gate, limit = routed
        if timeout is not None:
            timeout = max(0.0, timeout - (monotonic() - started))
        timeout = bounded(timeout, limit)
        if blocking:
            try:
                return getattr(method, name)(request, timeout, metadata, credentials, wait_for_ready, compression)
            finally:
                gate.release()
        try:
            call = getattr(method, name)(request, timeout, metadata, credentials, wait_for_ready, compression)
        except BaseException:
            gate.release()
            raise
        call.add_done_callback(gate.release)
        return call


class _UnaryUnary(_Routed, bases.UnaryUnaryMultiCallable):
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


class _UnaryStream(_Routed, bases.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call("__call__", request, timeout, metadata, credentials, wait_for_ready, compression)


class _StreamUnary(_Routed, bases.StreamUnaryMultiCallable):
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


class _StreamStream(_Routed, bases.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call("__call__", request_iterator, timeout, metadata, credentials, wait_for_ready, compression)


class XdsChannel(Channel):
    """A grpc_retry channel on an `xds:` target, its backends told by the control plane."""

    def __init__(self, target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression]) -> None:
        self._state = ChannelState(target, options)
        self._router = XdsRouter(target, self._state.options,
                                 lambda where, opts: SyncSubchannels(where, opts, credentials, compression),
                                 lambda: lambda apply: apply())
        self._subchannels: Any = self._router  # (what subscribe() watches and close() closes)
        self._workers = Workers("grpc_retry-worker")
        self._lock = threading.Lock()
        self._subscriptions: List[_Subscription] = []

    def unary_unary(self, method: str, request_serializer: Serializer = None,
                    response_deserializer: Deserializer = None,
                    _registered_method: Optional[bool] = False) -> Any:
        return _UnaryUnary(self, method, request_serializer, response_deserializer, "unary_unary",
                           UnaryUnaryMultiCallable)

    def unary_stream(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None,
                     _registered_method: Optional[bool] = False) -> Any:
        return _UnaryStream(self, method, request_serializer, response_deserializer, "unary_stream",
                            UnaryStreamMultiCallable)

    def stream_unary(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None,
                     _registered_method: Optional[bool] = False) -> Any:
        return _StreamUnary(self, method, request_serializer, response_deserializer, "stream_unary",
                            StreamUnaryMultiCallable)

    def stream_stream(self, method: str, request_serializer: Serializer = None,
                      response_deserializer: Deserializer = None,
                      _registered_method: Optional[bool] = False) -> Any:
        return _StreamStream(self, method, request_serializer, response_deserializer, "stream_stream",
                             StreamStreamMultiCallable)



def xds_channel(target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                compression: Optional[grpc.Compression]) -> Optional[Channel]:
    """A channel of grpc_retry's own xDS client, or None without the `xds` extra (the target then goes whole to
    grpcio)."""
    try:
        import envoy  # noqa: F401
    except ImportError:
        return None
    return XdsChannel(target, options, credentials, compression)
