"""What both channels' methods share: the method's policy, resolved once; the call machine of each call; and the
method on each subchannel (the grpcio multicallable that attempts go through, carrying bytes)."""

from __future__ import annotations

import logging
import math
from random import getrandbits
from time import monotonic
from typing import Any, Callable, Dict, Optional, Tuple

import grpc

from grpc_retry._channel_state import ChannelState
from grpc_retry._core import RING_HASH, WATCH_EVERY, WATCH_FIRST, CallMachine, HeadersWatch
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
UNDESERIALIZABLE = object()  # what deserialize() returns when the application's deserializer failed
DESERIALIZE_FAILED = "Exception deserializing response!"


class Method:
    """One method of a channel. `subchannels`, `deserializer`, `attempt_streams`, `unary_response`, `direct`,
    `headers_first` and `watched` are what the drivers read."""

    __slots__ = ("_state", "_method", "_serializer", "deserializer", "_inner", "_policy", "_attempt_kind",
                 "direct", "headers_first", "subchannels", "_shape", "calls", "attempt_streams",
                 "unary_response", "watched", "_timeout", "_wait_for_ready", "_throttle", "_pool", "_picker",
                 "_per_rpc_buffer", "_enable_retries", "_budget", "_admission", "_hashing", "_faults", "_telemetry",
                 "_addresses",
                 "_started", "_watch", "_early_said")
    # The channel flavor's attempt maker, of the transport chosen at import (grpc_retry/_transport: its SYNC or AIO)
    ATTEMPTS: Any = None
    # Loop turns a timed call's due timer may wait for inputs queued before it (CallMachine.timer: FLUSH)
    FLUSH_TURNS = 0

    def __init__(self, state: ChannelState, subchannels: Any, method: str, serializer: Serializer,
                 deserializer: Deserializer, kind: str, admission: Any = None,
                 hashing: Optional[Tuple[Any, int]] = None,
                 faults: Optional[Callable[[Any], Tuple[float, int]]] = None) -> None:
        self._state = state
        self._admission = admission  # a routed cluster's (its retry budget, if any, is its calls'), or None
        # ring_hash: (the route's hash policies, the channel id), or None: each call a random hash; else False
        self._hashing: Any = hashing if subchannels.picker.policy == RING_HASH else False
        self._faults = faults  # a routed call's fault filters (A33): metadata -> (delay, abort status); or None
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
        self._attempt_kind, self.direct, self.headers_first = self._shape
        self.attempt_streams = self._attempt_kind in STREAMING_SHAPES
        self.subchannels = subchannels
        self.calls = state.calls
        # What each call's machine is made with, read once: fixed for the channel's life (its rng is not: read
        # per call).
        self._timeout = self._policy.timeout
        self._wait_for_ready = self._policy.wait_for_ready
        self._throttle, self._pool, self._picker = state.throttle, state.pool, subchannels.picker
        self._budget = state.budget
        self._per_rpc_buffer, self._enable_retries = state.options.per_rpc_buffer, state.options.enable_retries
        self._telemetry = state.telemetry
        self._addresses = subchannels.addresses  # (one list, grown in place)
        self._started = subchannels.attempt_started if getattr(subchannels, "reads_started", False) else None
        self._inner: Dict[int, Tuple[Any, Any]] = {}  # address index -> (its grpcio channel, this method on it)
        self._watch: Optional[HeadersWatch] = None  # the channel's, for this method (first_whole)
        if hedged and kind == "unary_unary" and (self.direct or self.headers_first):
            watch = state.watches.get(method)
            if watch is None:
                watch = state.watches[method] = HeadersWatch(WATCH_FIRST, WATCH_EVERY * self.ATTEMPTS.watch_spacing)
            self._watch = watch
        self._early_said = False

    def inner(self, index: int) -> Any:
        """This method on subchannel `index`. Attempts carry bytes: the application's (de)serializers run once per
        message, in grpc_retry, not once per attempt."""
        channel = self.subchannels.channel(index)
        entry = self._inner.get(index)
        if entry is None or entry[0] is not channel:  # new, or the address came back on a new grpcio channel
            entry = self._inner[index] = (channel, self.ATTEMPTS.method(channel, self._method, self._shape, self))
        return entry[1]

    def first_whole(self) -> bool:
        """(Hedged unary-unary calls.) Whether a starting call's first attempt may be one batch (the core's
        HeadersWatch, which each call's machine tells when its server sends headers ahead)."""
        watch = self._watch
        if watch is None:
            return False
        if watch.early and not self._early_said:
            self._early_said = True
            log.debug("grpc_retry: %s sends response headers ahead of its response: hedged calls now see each "
                      "attempt's headers first", self._method)
        return watch.first_whole()

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

    def _machine(self, timeout: Optional[float], wait_for_ready: Optional[bool], unary_request: bool,
                 metadata: Any) -> CallMachine:
        """A new call's machine: its deadline is the sooner of the call's timeout and the method's; under
        ring_hash, its request hash (A42) from its metadata."""
        limit = self._timeout
        if timeout is not None and timeout < limit:
            limit = timeout
        if wait_for_ready is None:
            wait_for_ready = self._wait_for_ready
        machine = CallMachine(self._policy, self._throttle, self._pool, self._picker, self._per_rpc_buffer,
                              _INF if limit == _INF else monotonic() + limit, self._state.rng, self._enable_retries,
                              bool(wait_for_ready), unary_request)
        if self._watch is not None:
            machine.watch = self._watch
        if self.watched:
            machine.flush_turns = self.FLUSH_TURNS
        # A routed cluster's retry budget, read per call (its control plane may change it), else the channel's
        budget = None if self._admission is None else self._admission.budget
        if budget is None:
            budget = self._budget
        if budget is not None:
            machine.budget = budget
        hashing = self._hashing
        if hashing is not False:
            machine.request_hash = getrandbits(64) if hashing is None else hashing[0].of(metadata, hashing[1])
        if self._faults is not None:
            machine.fault_delay, machine.fault_code = self._faults(metadata)
        return machine


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
