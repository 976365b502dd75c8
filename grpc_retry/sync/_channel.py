"""grpc_retry's synchronous channels: grpc.Channel's interface over one grpcio channel per resolved address
(C-core's own retries off in each), every attempt on the address the call machine picked for it."""

from __future__ import annotations

import math
import threading
import weakref
from time import monotonic
from typing import Optional

import grpc

from grpc_retry._channel_state import ChannelState
from grpc_retry._core import CallMachine
from grpc_retry._driver import log
from grpc_retry._options import OptionsType
from grpc_retry._subchannels import SyncSubchannels
from grpc_retry.sync._call import BlockingCall, Call, StreamingCall, local_error

_INF = math.inf
_STREAMING_SHAPES = ("unary_stream", "stream_stream")


class _MultiCallable:
    """One method of the channel: resolves its policy once, then makes calls."""

    __slots__ = ("_channel", "_state", "_method", "_serializer", "deserializer", "_inner", "_policy", "_kind",
                 "_attempt_kind", "subchannels", "attempt_streams", "unary_response")

    def __init__(self, channel: Channel, method: str, serializer, deserializer, kind: str):
        self._channel = channel
        self._state = channel._state
        self._method = method
        self._serializer = serializer
        self.deserializer = deserializer
        self._policy = self._state.policy(method)
        self._kind = kind
        # A hedged unary call needs to see each attempt's response headers before its response (they commit
        # it): grpcio's unary-unary shape delivers both at once, its unary-stream shape does not.
        self._attempt_kind = "unary_stream" if kind == "unary_unary" and self._policy.hedging else kind
        self.attempt_streams = self._attempt_kind in _STREAMING_SHAPES
        self.unary_response = kind in ("unary_unary", "stream_unary")
        self.subchannels = channel._subchannels
        self._inner: dict = {}  # address index -> (its grpcio channel, this method on it)

    def inner(self, index: int):
        """This method on subchannel `index`. Attempts carry bytes: the application's (de)serializers run
        once per message, in grpc_retry, not once per attempt."""
        channel = self.subchannels.channel(index)
        entry = self._inner.get(index)
        if entry is None or entry[0] is not channel:  # new, or the address came back on a new channel
            entry = self._inner[index] = (channel, getattr(channel, self._attempt_kind)(self._method))
        return entry[1]

    def closed(self) -> bool:
        return self._channel._closed

    def _machine(self, timeout, wait_for_ready, unary_request: bool) -> CallMachine:
        state, policy = self._state, self._policy
        limit = policy.timeout
        if timeout is not None and timeout < limit:
            limit = timeout
        if wait_for_ready is None:
            wait_for_ready = policy.wait_for_ready
        options = state.options
        return CallMachine(policy, state.throttle, state.pool, self.subchannels.picker, options.per_rpc_buffer,
                           _INF if limit == _INF else monotonic() + limit, state.rng, options.enable_retries,
                           bool(wait_for_ready), unary_request)

    def _serialize(self, request) -> bytes:
        if self._serializer is None:
            return request
        try:
            return self._serializer(request)
        except Exception:
            log.exception("request serializer failed")
            raise local_error(grpc.StatusCode.INTERNAL, "Exception serializing request!") from None

    def _call(self, request, request_iterator, timeout, metadata, credentials, wait_for_ready, compression):
        """The non-blocking call object (a future; for response streams, also the iterator)."""
        machine = self._machine(timeout, wait_for_ready, request_iterator is None)
        cls = Call if self.unary_response else StreamingCall
        return cls(self, machine, request, request_iterator, self._serializer, metadata, credentials,
                   wait_for_ready, compression, self._channel._calls)

    def _blocking(self, request, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                  with_call: bool):
        if request_iterator is None and not self._policy.hedging:
            # The hot path: attempts inline on the caller's thread, as grpcio's own blocking call.
            machine = self._machine(timeout, wait_for_ready, True)
            return BlockingCall(self, machine, request, metadata, credentials, wait_for_ready, compression,
                                False).run(with_call)
        call = self._call(request, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)
        response = call.result()
        return (response, call) if with_call else response


class UnaryUnaryMultiCallable(_MultiCallable, grpc.UnaryUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        return self._blocking(self._serialize(request), None, timeout, metadata, credentials, wait_for_ready,
                              compression, False)

    def with_call(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                  compression=None):
        return self._blocking(self._serialize(request), None, timeout, metadata, credentials, wait_for_ready,
                              compression, True)

    def future(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
               compression=None):
        try:
            data = self._serialize(request)
        except grpc.RpcError as error:
            return error  # a frozen error is a finished grpc.Future too
        return self._call(data, None, timeout, metadata, credentials, wait_for_ready, compression)


class UnaryStreamMultiCallable(_MultiCallable, grpc.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        return self._call(self._serialize(request), None, timeout, metadata, credentials, wait_for_ready,
                          compression)


class StreamUnaryMultiCallable(_MultiCallable, grpc.StreamUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        return self._blocking(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                              False)

    def with_call(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                  compression=None):
        return self._blocking(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                              True)

    def future(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
               compression=None):
        return self._call(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)


class StreamStreamMultiCallable(_MultiCallable, grpc.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        return self._call(None, request_iterator, timeout, metadata, credentials, wait_for_ready, compression)


class Channel(grpc.Channel):
    """A grpc.Channel whose calls are retried by grpc_retry's core (gRFC A6)."""

    def __init__(self, target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression]):
        self._state = ChannelState(target, options)
        self._subchannels = SyncSubchannels(target, self._state.options, credentials, compression)
        self._calls: weakref.WeakSet = weakref.WeakSet()  # non-blocking calls still running
        self._calls_lock = threading.Lock()
        self._subscriptions: list = []
        self._closed = False

    def unary_unary(self, method, request_serializer=None, response_deserializer=None,
                    _registered_method=False) -> UnaryUnaryMultiCallable:
        return UnaryUnaryMultiCallable(self, method, request_serializer, response_deserializer, "unary_unary")

    def unary_stream(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False) -> UnaryStreamMultiCallable:
        return UnaryStreamMultiCallable(self, method, request_serializer, response_deserializer, "unary_stream")

    def stream_unary(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False) -> StreamUnaryMultiCallable:
        return StreamUnaryMultiCallable(self, method, request_serializer, response_deserializer, "stream_unary")

    def stream_stream(self, method, request_serializer=None, response_deserializer=None,
                      _registered_method=False) -> StreamStreamMultiCallable:
        return StreamStreamMultiCallable(self, method, request_serializer, response_deserializer,
                                         "stream_stream")

    def subscribe(self, callback, try_to_connect=False) -> None:
        """As grpc.Channel.subscribe, for the channel's aggregate connectivity (READY if any subchannel is):
        `callback` gets the current state at once (on another thread), then each change."""
        subscription = _Subscription(self._subchannels, callback)
        with self._calls_lock:
            self._subscriptions.append(subscription)
        self._subchannels.watch(subscription)
        if try_to_connect:
            self._subchannels.connect()
        threading.Thread(target=subscription, name="grpc_retry-connectivity", daemon=True).start()

    def unsubscribe(self, callback) -> None:
        with self._calls_lock:
            for subscription in self._subscriptions:
                if subscription.callback == callback:
                    self._subscriptions.remove(subscription)
                    self._subchannels.watch(subscription, add=False)
                    return

    def close(self) -> None:
        """End every call and timer this channel owns, then close the subchannels."""
        self._closed = True
        for call in list(self._calls):
            call.close_channel()
        with self._calls_lock:
            subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            self._subchannels.watch(subscription, add=False)
        self._subchannels.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> bool:
        self.close()
        return False

    def retry_stats(self) -> dict:
        """Per method (A6 "Retry and Hedging Statistics"): retry attempts made, those that failed, and a
        histogram of which retry each was (hedges after the first count as retries)."""
        return self._state.retry_stats()

    @property
    def throttle_tokens(self) -> Optional[float]:
        """Current retry-throttle tokens of this channel's server name (None without retryThrottling)."""
        throttle = self._state.throttle
        return None if throttle is None else throttle.tokens


class _Subscription:
    """One subscribe() callback: told the aggregate state whenever it differs from what it was last told,
    one delivery at a time."""

    __slots__ = ("subchannels", "callback", "last", "lock")

    def __init__(self, subchannels: SyncSubchannels, callback):
        self.subchannels = subchannels
        self.callback = callback
        self.last = None
        self.lock = threading.Lock()

    def __call__(self) -> None:
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
    return Channel(target, options, None, compression)


def secure_channel(target: str, credentials: grpc.ChannelCredentials, options: OptionsType = None,
                   compression: Optional[grpc.Compression] = None) -> Channel:
    """Like grpc.secure_channel, with grpc_retry doing the retries."""
    if credentials is None:
        raise ValueError("secure_channel needs credentials")
    return Channel(target, options, credentials, compression)
