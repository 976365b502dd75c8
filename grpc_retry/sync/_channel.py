"""grpc_retry's synchronous channels: grpc.Channel's interface over one grpcio channel per resolved address
(C-core's own retries off in each), every attempt on the address the call machine picked for it. A channel whose
target has a router (an `xds:` target: _backends/routers.py) makes its methods routed (sync/_routed.py): each call
takes its route, cluster and retry policy from the router, then runs as here on that cluster's subchannels."""

from __future__ import annotations

import math
import threading
from time import monotonic
from types import TracebackType
from typing import Any, Callable, Iterator, List, Optional, Type

import grpc

from grpc_retry import _bases as bases
from grpc_retry._backends import SyncSubchannels, serially
from grpc_retry._backends.routers import notes_for, router_for
from grpc_retry._channel_state import ChannelState
from grpc_retry._driver import log
from grpc_retry._method import Compression, Credentials, Deserializer, Metadata, Method, RetryStatistics, Serializer
from grpc_retry._options import OptionsType
from grpc_retry._transport import completions
from grpc_retry._transport import transport as internals
from grpc_retry.sync import _routed
from grpc_retry.sync._call import Call, StreamingCall, _Future
from grpc_retry.sync._driver import EXCHANGE, NO_CALLER, POLLED, STREAMED
from grpc_retry.sync._status import CLOSED_CHANNEL, FinishedCall, local_error
from grpc_retry.sync._workers import Workers

_INF = math.inf
# close(): how long the calls whose attempts grpcio's close cancels may take to hear it (milliseconds, in practice)
# before grpc_retry ends them itself.
CLOSE_WAIT = 1.0


class _MultiCallable(Method):
    """One method of the channel: resolves its policy once, then makes calls."""

    __slots__ = ("workers",)
    ATTEMPTS = internals.SYNC

    def __init__(self, channel: Channel, method: str, serializer: Serializer, deserializer: Deserializer,
                 kind: str) -> None:
        super().__init__(channel._state, channel._subchannels, method, serializer, deserializer, kind,
                         getattr(channel, "_admission", None), getattr(channel, "_hashing", None),
                         getattr(channel, "_faults", None))
        self.workers = channel._workers

    def _request_bytes(self, request: Any) -> bytes:
        data = self._serialize(request)
        if data is None:
            raise local_error(grpc.StatusCode.INTERNAL, "Exception serializing request!")
        return data

    def _call(self, request: Optional[bytes], request_iterator: Optional[Iterator[Any]], timeout: Optional[float],
              metadata: Metadata, credentials: Credentials, wait_for_ready: Optional[bool],
              compression: Compression) -> Call:
        """The non-blocking call object (a future; for response streams, also the iterator)."""
        if self._state.closed:
            raise ValueError(CLOSED_CHANNEL)
        machine = self._machine(timeout, wait_for_ready, request_iterator is None, metadata)
        cls: Type[Call] = Call if self.unary_response else StreamingCall
        return cls(self, machine, request, request_iterator, self._serializer, metadata, credentials,
                   wait_for_ready, compression)

    def _blocking(self, request: Optional[bytes], request_iterator: Optional[Iterator[Any]], timeout: Optional[float],
                  metadata: Metadata, credentials: Credentials, wait_for_ready: Optional[bool],
                  compression: Compression, with_call: bool) -> Any:
        if self._state.closed:
            raise ValueError(CLOSED_CHANNEL)
        # The caller's thread makes and runs each attempt while it is free, as grpcio's own blocking call does
        if request_iterator is None:
            # A timed call (perAttemptRecvTimeout) whose attempts may be one batch each (Method.first_whole)
            # takes its attempts as an unwatched one does: each attempt's timer is its deadline.
            if not self.watched or not self._policy.hedging and self.first_whole():
                caller = EXCHANGE
            elif self.headers_first:  # its attempts show their headers first: the caller polls them
                caller = POLLED
            else:
                caller = NO_CALLER
        elif not self.watched:
            # A stream-unary call runs its attempts on its caller's thread (grpcio's future starts and ends the spin
            # thread with each call that overlaps no other: ~50% more CPU a call, one at a time).
            caller = STREAMED
        else:
            caller = NO_CALLER
        if caller != NO_CALLER:
            machine = self._machine(timeout, wait_for_ready, request_iterator is None, metadata)
            # (the driver's own type, made without its constructor: the application never sees a blocking call)
            call = _Future.__new__(_Future)
            call._init_call(self, machine, request, request_iterator, self._serializer, metadata, credentials,
                            wait_for_ready, compression, caller)
            return call.run(with_call)
        call = self._call(request, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)
        response = call.result()
        if not with_call:
            return response
        # As grpcio's with_call(): a call that has ended (no time remaining), not the live future
        return response, FinishedCall(call, call.trailing_metadata(), response)


class UnaryUnaryMultiCallable(_MultiCallable, bases.UnaryUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._blocking(self._request_bytes(request), None, timeout, metadata, credentials, wait_for_ready,
                              compression, False)

    def with_call(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                  credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                  compression: Compression = None) -> Any:
        return self._blocking(self._request_bytes(request), None, timeout, metadata, credentials, wait_for_ready,
                              compression, True)

    def future(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
               credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
               compression: Compression = None) -> Any:
        try:
            data = self._request_bytes(request)
        except grpc.RpcError as error:
            return error  # a frozen error is a finished grpc.Future too
        return self._call(data, None, timeout, metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(_MultiCallable, bases.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request: Any, timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call(self._request_bytes(request), None, timeout, metadata, credentials, wait_for_ready,
                          compression)


class StreamUnaryMultiCallable(_MultiCallable, bases.StreamUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._blocking(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                              False)

    def with_call(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                  credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                  compression: Compression = None) -> Any:
        return self._blocking(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                              True)

    def future(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
               credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
               compression: Compression = None) -> Any:
        return self._call(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)


class StreamStreamMultiCallable(_MultiCallable, bases.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator: Iterator[Any], timeout: Optional[float] = None, metadata: Metadata = None,
                 credentials: Credentials = None, wait_for_ready: Optional[bool] = None,
                 compression: Compression = None) -> Any:
        return self._call(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)


class Channel(RetryStatistics, grpc.Channel):
    """A grpc.Channel whose calls are retried by grpc_retry's core (gRFC A6)."""

    def __init__(self, target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression]) -> None:
        self._state = ChannelState(target, options)
        self._workers = Workers("grpc_retry-worker")
        # Its calls' router, if its target has one; else its own subchannels (what subscribe() watches and
        # close() closes: the router's, every cluster's).
        self._router: Any = router_for(target, self._state.options, credentials,
                                       lambda where, opts: SyncSubchannels(where, opts, credentials, compression),
                                       lambda: _now, self._workers.submit)
        if self._router is None:
            self._subchannels: Any = SyncSubchannels(target, self._state.options, credentials, compression)
            self._subchannels.explain = notes_for(target, credentials)
            self._state.observe_backends(self._subchannels)
        else:
            self._subchannels = self._router
        self._lock = threading.Lock()
        self._subscriptions: List[_Subscription] = []

    def unary_unary(self, method: str, request_serializer: Serializer = None,
                    response_deserializer: Deserializer = None,
                    _registered_method: Optional[bool] = False) -> bases.UnaryUnaryMultiCallable:
        if self._router is not None:
            return _routed.UnaryUnary(self, method, request_serializer, response_deserializer, "unary_unary",
                                      UnaryUnaryMultiCallable)
        return UnaryUnaryMultiCallable(self, method, request_serializer, response_deserializer, "unary_unary")

    def unary_stream(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None,
                     _registered_method: Optional[bool] = False) -> bases.UnaryStreamMultiCallable:
        if self._router is not None:
            return _routed.UnaryStream(self, method, request_serializer, response_deserializer, "unary_stream",
                                       UnaryStreamMultiCallable)
        return UnaryStreamMultiCallable(self, method, request_serializer, response_deserializer, "unary_stream")

    def stream_unary(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None,
                     _registered_method: Optional[bool] = False) -> bases.StreamUnaryMultiCallable:
        if self._router is not None:
            return _routed.StreamUnary(self, method, request_serializer, response_deserializer, "stream_unary",
                                       StreamUnaryMultiCallable)
        return StreamUnaryMultiCallable(self, method, request_serializer, response_deserializer, "stream_unary")

    def stream_stream(self, method: str, request_serializer: Serializer = None,
                      response_deserializer: Deserializer = None,
                      _registered_method: Optional[bool] = False) -> bases.StreamStreamMultiCallable:
        if self._router is not None:
            return _routed.StreamStream(self, method, request_serializer, response_deserializer, "stream_stream",
                                        StreamStreamMultiCallable)
        return StreamStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                         "stream_stream")

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        """As grpc.Channel.subscribe, for the channel's aggregate connectivity (READY if any subchannel is):
        `callback` gets the current state at once (on another thread), then each change."""
        subscription = _Subscription(self._subchannels, callback)
        with self._lock:
            self._subscriptions.append(subscription)
        self._subchannels.watch(subscription)
        if try_to_connect:
            self._subchannels.connect()
        subscription()

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        with self._lock:
            for subscription in self._subscriptions:
                if subscription.callback == callback:
                    self._subscriptions.remove(subscription)
                    self._subchannels.watch(subscription, add=False)
                    return

    def close(self) -> None:
        """As grpcio's: every call ends CANCELLED before this returns — one with an attempt in flight as grpcio's
        close ends that attempt, one in backoff or waiting for a subchannel with grpcio's words — and so does
        every timer and thread the channel started."""
        with self._lock:
            state = self._state
            if state.closed:
                return
            state.close()
            subscriptions, self._subscriptions = self._subscriptions, []
        calls = list(state.calls)
        for call in calls:
            call.close_channel()
        for subscription in subscriptions:
            self._subchannels.watch(subscription, add=False)
        self._workers.close()
        self._subchannels.close()
        deadline = monotonic() + CLOSE_WAIT
        for call in calls:
            call.closed(deadline - monotonic())

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc_val: Optional[BaseException],
                 exc_tb: Optional[TracebackType]) -> None:
        self.close()


def _now(apply: Callable[[], None]) -> None:
    """Where a sync channel's router applies a config: on the thread that has it."""
    apply()


class _Subscription:
    """One subscribe() callback: told the aggregate state whenever it differs from what it was last told,
    one delivery at a time."""

    __slots__ = ("subchannels", "callback", "last", "lock")

    def __init__(self, subchannels: SyncSubchannels, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        self.subchannels = subchannels
        self.callback = callback
        self.last: Optional[grpc.ChannelConnectivity] = None
        self.lock = threading.Lock()

    def __call__(self) -> None:
        serially(self._deliver)  # grpcio calls them on a thread of its own: never on the caller's, nor the poller's

    def _deliver(self) -> None:
        with self.lock:
            state = self.subchannels.aggregate_state()
            if state is self.last:
                return
            self.last = state
            try:
                self.callback(state)
            except Exception:
                log.exception("connectivity callback failed")


def insecure_channel(target: str, options: OptionsType = None,
                     compression: Optional[grpc.Compression] = None) -> Channel:
    """Like grpc.insecure_channel, with grpc_retry doing the retries."""
    return _channel(target, options, None, compression)


def secure_channel(target: str, credentials: grpc.ChannelCredentials, options: OptionsType = None,
                   compression: Optional[grpc.Compression] = None) -> Channel:
    """Like grpc.secure_channel, with grpc_retry doing the retries."""
    if credentials is None:
        raise ValueError("secure_channel needs credentials")
    return _channel(target, options, credentials, compression)


def _channel(target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
             compression: Optional[grpc.Compression]) -> Channel:
    completions.ensure("sync")  # once per process: grpcio completes attempts as the direct transport relies on
    return Channel(target, options, credentials, compression)
