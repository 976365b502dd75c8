"""grpc_retry's synchronous channels: grpc.Channel's interface over a subchannel whose own retries are off."""

from __future__ import annotations

import math
import threading
import weakref
from time import monotonic
from typing import Optional

import grpc

from grpc_retry import _sync_call as calls
from grpc_retry._channel_state import ChannelState
from grpc_retry._core import RetryCall
from grpc_retry._options import OptionsType

_INF = math.inf


class _MultiCallable:
    __slots__ = ("_channel", "_state", "_method", "_serializer", "_deserializer", "_inner", "_policy")

    def __init__(self, channel: Channel, method: str, serializer, deserializer, kind: str):
        self._channel = channel
        self._state = channel._state
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer
        self._policy = self._state.policy(method)
        # Attempts carry bytes: the application's (de)serializers run once per message, here.
        self._inner = getattr(channel._subchannel, kind)(method)

    def _attempts(self, timeout, metadata, credentials, wait_for_ready, compression) -> calls.Attempts:
        state, policy = self._state, self._policy
        limit = policy.timeout
        if timeout is not None and timeout < limit:
            limit = timeout
        deadline = _INF if limit == _INF else monotonic() + limit
        core = RetryCall(policy, state.throttle, state.pool, state.options.per_rpc_buffer, deadline, state.rng,
                         state.options.enable_retries)
        if wait_for_ready is None:
            wait_for_ready = policy.wait_for_ready
        return calls.Attempts(core, self._inner, metadata, credentials, wait_for_ready, compression,
                              self._deserializer, self._channel._is_closed)

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
        return calls.blocking_call(attempts, with_call=False)

    def with_call(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                  compression=None):
        attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        return calls.blocking_call(attempts, with_call=True)

    def future(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
               compression=None):
        try:
            attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        except grpc.RpcError as error:
            return error  # a frozen error is a finished grpc.Future too
        return calls.UnaryFuture(attempts, self._channel._calls)


class UnaryStreamMultiCallable(_MultiCallable, grpc.UnaryStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        attempts = self._unary_request(request, timeout, metadata, credentials, wait_for_ready, compression)
        return calls.StreamingCall(attempts, self._channel._calls)


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
            return calls.blocking_call(attempts, with_call)
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
        call = errors.call = calls.UnaryFuture(attempts, self._channel._calls)
        return call


class StreamStreamMultiCallable(_MultiCallable, grpc.StreamStreamMultiCallable):
    __slots__ = ()

    def __call__(self, request_iterator, timeout=None, metadata=None, credentials=None, wait_for_ready=None,
                 compression=None):
        errors = _StreamRequestErrors()
        attempts = self._stream_request(request_iterator, timeout, metadata, credentials, wait_for_ready,
                                        compression, errors)
        call = errors.call = calls.StreamingCall(attempts, self._channel._calls)
        return call


class Channel(grpc.Channel):
    """A grpc.Channel whose calls are retried by grpc_retry's core (gRFC A6)."""

    def __init__(self, target: str, options: OptionsType, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression]):
        self._state = ChannelState(target, options)
        # C-core's own retries are off: grpc_retry alone retries, so attempts are never multiplied.
        sub_options = list(self._state.options.passthrough) + [("grpc.enable_retries", 0)]
        if credentials is None:
            self._subchannel = grpc.insecure_channel(target, options=sub_options, compression=compression)
        else:
            self._subchannel = grpc.secure_channel(target, credentials, options=sub_options,
                                                   compression=compression)
        self._calls: weakref.WeakSet = weakref.WeakSet()  # non-blocking calls still running
        self._calls_lock = threading.Lock()
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
        self._subchannel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback) -> None:
        self._subchannel.unsubscribe(callback)

    def close(self) -> None:
        """End every call and timer this channel owns, then close the subchannel."""
        self._closed = True
        for call in list(self._calls):
            call._fail_local(grpc.StatusCode.CANCELLED, "Channel closed!")
        self._subchannel.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> bool:
        self.close()
        return False

    @property
    def throttle_tokens(self) -> Optional[float]:
        """Current retry-throttle tokens of this channel's server name (None without retryThrottling)."""
        throttle = self._state.throttle
        return None if throttle is None else throttle.tokens


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
