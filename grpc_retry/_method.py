"""What both channels' methods share: the method's policy, resolved once; the call machine of each call; and the
method on each subchannel (the grpcio multicallable that attempts go through, carrying bytes)."""

from __future__ import annotations

import logging
import math
from time import monotonic
from typing import Any, Callable, Dict, Optional, Tuple

import grpc

from grpc_retry._channel_state import ChannelState
from grpc_retry._core import CallMachine
from grpc_retry._stats import ChannelStats, ThrottleState, throttle_state
from grpc_retry._telemetry import CallTelemetry

# What the application passes to a channel's methods and calls.
Serializer = Optional[Callable[[Any], bytes]]
Deserializer = Optional[Callable[[bytes], Any]]
Metadata = Optional[Any]  # a sequence of (key, value) pairs
Credentials = Optional[grpc.CallCredentials]
Compression = Optional[grpc.Compression]

_INF = math.inf
log = logging.getLogger("grpc_retry")  # (not _driver's: _driver is built on this module)
STREAMING_SHAPES = ("unary_stream", "stream_stream")
# HeadersWatch: which of a hedged method's calls show their first attempt's headers first (its first WATCH_FIRST, then
# one in every WATCH_EVERY), and how far ahead of its response a header counts as sent ahead of it (seconds).
WATCH_FIRST = 16
WATCH_EVERY = 32
EARLY_HEADERS = 0.02
UNDESERIALIZABLE = object()  # what deserialize() returns when the application's deserializer failed
DESERIALIZE_FAILED = "Exception deserializing response!"


class HeadersWatch:
    """Whether a hedged unary-unary call's first attempt may be one batch, as an unhedged call's is (per channel
    and method). Its headers then show with its response; the second batch a headers-first attempt needs (C-core
    tells headers only through a batch of their own) is ~15% of such a call's instructions.

    A6 commits a hedged call on response headers, and while the first attempt is out alone nothing waits on them
    but the next hedge's timer. Servers send a unary response's headers with it (A6 asks them to, unless the
    application sends them early): one batch then decides as the headers would have. A server that sends them well
    ahead (EARLY_HEADERS) would see a hedge go out that its headers should have stopped; so the method's first
    WATCH_FIRST calls, one in every WATCH_EVERY after, and every hedge show their headers first, and once one
    showed them ahead, every first attempt does from then on."""

    __slots__ = ("_method", "_calls", "_early")

    def __init__(self, method: str) -> None:
        self._method = method
        self._calls = 0       # hedged calls started
        self._early = False   # the server was seen sending response headers ahead of a response

    def first_whole(self) -> bool:
        if self._early:
            return False
        calls = self._calls = self._calls + 1
        return calls > WATCH_FIRST and calls % WATCH_EVERY != 0

    def headers_early(self) -> None:
        """A headers-first attempt's headers came ahead of its response (EARLY_HEADERS), or empty and followed by
        silence."""
        if not self._early:
            self._early = True
            log.debug("grpc_retry: %s sends response headers ahead of its response: hedged calls now see each "
                      "attempt's headers first", self._method)


class Method:
    """One method of a channel. `subchannels`, `deserializer`, `attempt_streams`, `unary_response`, `direct`,
    `headers_first`, `reports_end` and `watched` are what the drivers read."""

    __slots__ = ("_state", "_method", "_serializer", "deserializer", "_inner", "_policy", "_attempt_kind",
                 "direct", "headers_first", "reports_end", "subchannels", "_shape", "calls", "attempt_streams",
                 "unary_response", "watched", "_timeout", "_wait_for_ready", "_throttle", "_pool", "_picker",
                 "_per_rpc_buffer", "_enable_retries", "_telemetry", "_addresses", "_started", "_watch")
    # The channel flavor's attempt maker, of the transport chosen at import (grpc_retry/_transport: its SYNC or AIO)
    ATTEMPTS: Any = None

    def __init__(self, state: ChannelState, subchannels: Any, method: str, serializer: Serializer,
                 deserializer: Deserializer, kind: str) -> None:
        self._state = state
        self._method = method
        self._serializer = serializer
        self.deserializer = deserializer
        self._policy = state.policy(method)
        self.unary_response = kind in ("unary_unary", "stream_unary")
        # Watched: each attempt's first answer matters as it comes, not only with its end — a hedge's (it commits
        # the call before the next hedge) or a timed attempt's (it stops the perAttemptRecvTimeout). With a unary
        # response that takes attempts that show their headers first: the transport tells how (_transport's table).
        self.watched = self._policy.hedging or self._policy.recv_timeout != _INF
        hedged = self.watched and self.unary_response
        self._shape = self.ATTEMPTS.shape(kind, hedged)
        self._attempt_kind, self.direct, self.headers_first, self.reports_end = self._shape
        self.attempt_streams = self._attempt_kind in STREAMING_SHAPES
        self.subchannels = subchannels
        self.calls = state.calls
        # What each call's machine is made with, read once: fixed for the channel's life (its rng is not: read
        # per call).
        self._timeout = self._policy.timeout
        self._wait_for_ready = self._policy.wait_for_ready
        self._throttle, self._pool, self._picker = state.throttle, state.pool, subchannels.picker
        self._per_rpc_buffer, self._enable_retries = state.options.per_rpc_buffer, state.options.enable_retries
        self._telemetry = state.telemetry
        self._addresses = subchannels.addresses  # (one list, grown in place)
        self._started = subchannels.attempt_started if getattr(subchannels, "reads_started", False) else None
        self._inner: Dict[int, Tuple[Any, Any]] = {}  # address index -> (its grpcio channel, this method on it)
        self._watch: Optional[HeadersWatch] = None  # the channel's, for this method (first_whole)
        if hedged and kind == "unary_unary" and (self.direct or self.headers_first):
            watch = state.watches.get(method)
            if watch is None:
                watch = state.watches[method] = HeadersWatch(method)
            self._watch = watch

    def inner(self, index: int) -> Any:
        """This method on subchannel `index`. Attempts carry bytes: the application's (de)serializers run once per
        message, in grpc_retry, not once per attempt."""
        channel = self.subchannels.channel(index)
        entry = self._inner.get(index)
        if entry is None or entry[0] is not channel:  # new, or the address came back on a new grpcio channel
            entry = self._inner[index] = (channel, self.ATTEMPTS.method(channel, self._method, self._shape, self))
        return entry[1]

    def first_whole(self) -> bool:
        """(Hedged unary-unary calls.) Whether a starting call's first attempt may be one batch: HeadersWatch."""
        return self._watch is not None and self._watch.first_whole()

    def headers_early(self) -> None:
        if self._watch is not None:
            self._watch.headers_early()

    def attempt_started(self, index: int) -> None:
        """(Sync drivers.) An attempt has just been started on subchannel `index`: a name's subchannels read their
        state then (_backends/sync.py)."""
        started = self._started
        if started is not None:
            started(index)

    def _serialize(self, request: Any) -> Optional[bytes]:
        """The request's bytes, or None if the application's serializer failed (the call then fails INTERNAL)."""
        if self._serializer is None:
            data: Optional[bytes] = request  # (no cast(): a Python call on every call's path)
            return data
        try:
            return self._serializer(request)
        except Exception:
            log.exception("request serializer failed")
            return None

    def closed(self) -> bool:
        return self._state.closed

    def observe(self, machine: CallMachine) -> Optional[CallTelemetry]:
        """A starting call's telemetry, or None when nothing would be exported."""
        return self._telemetry.observe(self._method, machine, self._addresses)

    def deserialize(self, message: bytes) -> Any:
        """A response for the application, or UNDESERIALIZABLE (the call then fails INTERNAL)."""
        if self.deserializer is None:
            return message
        try:
            return self.deserializer(message)
        except Exception:
            log.exception("response deserializer failed")
            return UNDESERIALIZABLE

    def _machine(self, timeout: Optional[float], wait_for_ready: Optional[bool], unary_request: bool) -> CallMachine:
        """A new call's machine: its deadline is the sooner of the call's timeout and the method's."""
        limit = self._timeout
        if timeout is not None and timeout < limit:
            limit = timeout
        if wait_for_ready is None:
            wait_for_ready = self._wait_for_ready
        return CallMachine(self._policy, self._throttle, self._pool, self._picker, self._per_rpc_buffer,
                           _INF if limit == _INF else monotonic() + limit, self._state.rng, self._enable_retries,
                           bool(wait_for_ready), unary_request)


class RetryStatistics:
    """Mixin for both channels: what the channel's retries did."""

    _state: ChannelState
    _subchannels: Any  # the flavor's Subchannels

    def retry_stats(self) -> ChannelStats:
        """Per method with a retry or hedging policy, what its calls did so far: an immutable snapshot
        (`grpc_retry.MethodStats`), taken now; `.outlier_detection`: what outlier detection did."""
        outliers = self._subchannels.outliers
        return self._state.retry_stats(None if outliers is None else outliers.stats())

    @property
    def throttle(self) -> Optional[ThrottleState]:
        """The retry throttle of this channel's server name, now (None without retryThrottling). Every channel
        of the process to the same server name shares it, as A6 says."""
        return throttle_state(self._state.throttle)

    @property
    def throttle_tokens(self) -> Optional[float]:
        """Current retry-throttle tokens of this channel's server name (None without retryThrottling)."""
        throttle = self._state.throttle
        return None if throttle is None else throttle.tokens
