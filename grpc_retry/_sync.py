"""grpc_retry's synchronous channels: grpc.Channel's interface over one grpcio channel per resolved address
(C-core's own retries off in each), every attempt on the address the picker chose for it."""

from __future__ import annotations

import math
import threading
import weakref
from time import monotonic
from typing import Optional

import grpc

from grpc_retry import _sync_call as calls
from grpc_retry import _sync_hedging as hedging
from grpc_retry._channel_state import ChannelState
from grpc_retry._core import HedgingCall, RetryCall
from grpc_retry._options import OptionsType
from grpc_retry._subchannels import SyncSubchannels

_INF = math.inf


class _MultiCallable:
    __slots__ = ("_channel", "_state", "_method", "_serializer", "_deserializer", "_inner", "_policy", "_kind",
                 "_subchannels", "_hedged")

    def __init__(self, channel: Channel, method: str, serializer, deserializer, kind: str):
        self._channel = channel
        self._state = channel._state
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer
        self._policy = self._state.policy(method)
        self._hedged = self._policy.hedging
        self._kind = kind
        self._subchannels = channel._subchannels
        self._inner: dict = {}  # address index -> (its grpcio channel, this method on it)

    def _inner_on(self, index: int):
        """This method on subchannel `index`. Attempts carry bytes: the application's (de)serializers run
        once per message, in grpc_retry, not once per attempt."""
        channel = self._subchannels.channel(index)
        entry = self._inner.get(index)
        if entry is None or entry[0] is not channel:  # new, or the address came back on a new channel
            entry = self._inner[index] = (channel, getattr(channel, self._kind)(self._method))
        return entry[1]

    def _attempts(self, timeout, metadata, credentials, wait_for_ready, compression) -> calls.Attempts:
        state, policy = self._state, self._policy
        limit = policy.timeout
        if timeout is not None and timeout < limit:
            limit = timeout
        deadline = _INF if limit == _INF else monotonic() + limit
        if self._hedged:
            core = HedgingCall(policy, state.throttle, state.pool, state.options.per_rpc_buffer, deadline)
        else:
            core = RetryCall(policy, state.throttle, state.pool, state.options.per_rpc_buffer, deadline,
                             state.rng, state.options.enable_retries)
        if wait_for_ready is None:
            wait_for_ready = policy.wait_for_ready
        return calls.Attempts(core, self._subchannels, self._inner_on, metadata, credentials, wait_for_ready,
                              compression, self._deserializer, self._channel._is_closed,
                              state.options.enable_retries)

    # The call objects, hedged or retried.

    def _run_blocking(self, attempts: calls.Attempts, with_call: bool):
        if self._hedged:
            return hedging.blocking_call(hedging.HedgedCall(attempts, self._channel._calls, False), with_call)
        return calls.blocking_call(attempts, with_call)

    def _future(self, attempts: calls.Attempts):
        if self._hedged:
            return hedging.HedgedCall(attempts, self._channel._calls, False)
        return calls.UnaryFuture(attempts, self._channel._calls)

    def _streaming(self, attempts: calls.Attempts):
        if self._hedged:
            return hedging.HedgedCall(attempts, self._channel._calls, True)
        return calls.StreamingCall(attempts, self._channel._calls)

    def _unary_request(self, request, timeout, metadata, credentials, wait_for_ready, compression):
        attempts = self._attempts(timeout, metadata, credentials, wait_for_ready, compression)
        try:
            data = self._serializer(request) if self._serializer is not None else request
        except Exception:
            calls.log.exception("request serializer failed")
            attempts.core.finish()
            raise calls.local_error(grpc.StatusCode.INTERNAL, "Exception serializing request!") from None
        attempts.core.add_message(data)
        attempts.core.close_send()
        attempts.request = data
        return attempts

    def _stream_request(self, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                        on_error):
        attempts = self._attempts(timeout, metadata, credentials, wait_for_ready, compression)
        attempts.requests = calls.RequestSource(request_iterator, self._serializer, attempts.core, on_error)
        return attempts


class UnaryUnaryMultiCallable(_MultiCallable, grpc.UnaryUnaryMultiCallable):
    __slots__ = ()

    def __call__(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        return self._run_blocking(attempts, with_call=False)

    def with_call(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                  compression=None):
        attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        return self._run_blocking(attempts, with_call=True)

    def future(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
               compression=None):
        try:
            attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        except grpc.RpcError as error:
            return error  # a frozen error is a finished grpc.Future too
        return self._future(attempts)


class UnaryStreamMultiCallable(_MultiCallable, grpc.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        return self._streaming(attempts)


class _StreamRequestErrors:
    """Routes a request iterator's failure to the call object once it exists; blocking calls raise it."""

    __slots__ = ("call", "error")

    def __init__(self):
        self.call = None
        self.error = None

    def __call__(self, code, details):
        self.error = calls.local_error(code, details)
        if self.call is not None:
            self.call._fail_local(code, details)


class StreamUnaryMultiCallable(_MultiCallable, grpc.StreamUnaryMultiCallable):
    __slots__ = ()

    def _blocking(self, request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                  with_call):
        errors = _StreamRequestErrors()
        attempts = self._stream_request(request_iterator, timeout, metadata, credentials, wait_for_ready,
                                        compression, errors)
        try:
            return self._run_blocking(attempts, with_call)
        except grpc.RpcError:
            if errors.error is not None:
                raise errors.error from None
            raise

    def __call__(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        return self._blocking(request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                              False)

    def with_call(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                  compression=None):
        return self._blocking(request_iterator, timeout, metadata, credentials, wait_for_ready, compression,
                              True)

    def future(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
               compression=None):
        errors = _StreamRequestErrors()
        attempts = self._stream_request(request_iterator, timeout, metadata, credentials, wait_for_ready,
                                        compression, errors)
        call = errors.call = self._future(attempts)
        return call


class StreamStreamMultiCallable(_MultiCallable, grpc.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        errors = _StreamRequestErrors()
        attempts = self._stream_request(request_iterator, timeout, metadata, credentials, wait_for_ready,
                                        compression, errors)
        call = errors.call = self._streaming(attempts)
        return call


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

    def _is_closed(self) -> bool:
        return self._closed

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
            call._fail_local(grpc.StatusCode.CANCELLED, "Channel closed!")
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
                calls.log.exception("connectivity callback failed")


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
