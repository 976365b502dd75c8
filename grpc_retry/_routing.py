"""What both flavors' routed channels share: a channel whose resolver routes each call to one of several clusters.
Each method of the channel makes, per cluster and route policy, a method of the flavor's own (its _MultiCallable)
that runs the calls routed there as any other channel's, on that cluster's subchannels. A cluster may refuse calls:
its admission (below) is asked as each call enters it and told when the call ends."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, Optional, Protocol, Tuple

import grpc

from grpc_retry._core import RetryBudget
from grpc_retry._driver import CLOSED_DETAILS
from grpc_retry._method import Deserializer, Serializer

log = logging.getLogger("grpc_retry")


class RouteError(Exception):
    """A call no route of the router's current config can take (or that its cluster drops): it fails UNAVAILABLE
    with this message."""


class Admission(Protocol):
    """A cluster's admission of calls (the router gives it with each route): what the cluster's own parts let in,
    e.g. a limit on its calls in flight. Every call it admits is released exactly once, when the call ends."""

    def admit(self) -> bool:
        """The call enters; False: the cluster was retired since the call was routed (route it again). Raises
        the router's error for a call refused (it fails UNAVAILABLE with its words)."""

    def release(self, _: Any = None) -> None:
        """An admitted call has ended (a done callback's argument, if any, is the call)."""

    @property
    def budget(self) -> Optional[RetryBudget]:
        """The cluster's retry budget, which its calls' retries and hedges count against (None: the channel's)."""


class Cluster:
    """What a method reads of its channel: a cluster's subchannels, under one route's view of the channel state,
    the cluster's admission (its retry budget: per call, Method._machine), the route's request hash (ring_hash:
    the hash policies and the channel id they may hash to), its faults (metadata -> the call's delay and abort)
    and the channel's own workers (sync) or call timers (aio)."""

    __slots__ = ("_state", "_subchannels", "_admission", "_hashing", "_faults", "_workers", "_timers")

    def __init__(self, channel: Any, state: Any, subchannels: Any, admission: Admission,
                 hashing: Optional[Tuple[Any, int]] = None,
                 faults: Optional[Callable[[Any], Tuple[float, int]]] = None) -> None:
        self._state, self._subchannels, self._admission = state, subchannels, admission
        self._hashing, self._faults = hashing, faults
        self._workers, self._timers = getattr(channel, "_workers", None), getattr(channel, "_timers", None)


class RoutedMethod:
    """One method of a routed channel: per call, the method of its route's cluster that makes the call. Those made
    for a cluster or a route policy the config no longer has are dropped at the first call after it changed (the
    calls in flight keep theirs)."""

    __slots__ = ("_channel", "_method", "_serializer", "_deserializer", "_kind", "_make", "_extra", "_methods",
                 "_generation")

    def __init__(self, channel: Any, method: str, serializer: Serializer, deserializer: Deserializer, kind: str,
                 make: Callable[..., Any], *extra: Any) -> None:
        self._channel = channel
        self._method, self._serializer, self._deserializer, self._kind = method, serializer, deserializer, kind
        self._make, self._extra = make, extra  # the flavor's method class, and what else it takes
        # By (Subchannels, retry policy, hash policies, faults): the key holds its Subchannels, whose id no other
        # can take meanwhile.
        self._methods: Dict[Tuple[Any, Any, Any, Any], Any] = {}
        self._generation = -1  # the router's, when the methods were last pruned

    def admitted(self, metadata: Any, patient: bool) -> Optional[Tuple[Any, Admission, Optional[float]]]:
        """A new call's method, its cluster's admission (the call admitted) and its time limit; None before the
        first config (see the router's route()). The router's error: the call cannot be sent."""
        router = self._channel._router
        while True:
            routed = router.route(self._method, metadata, patient)
            if routed is None:
                return None
            admitted = self.method_of(routed)
            if admitted is not None:
                return admitted
            # (its cluster was retired between the two: the config standing names its successor)

    def method_of(self, routed: Tuple[Any, Any, Admission, Optional[float], Any]
                  ) -> Optional[Tuple[Any, Admission, Optional[float]]]:
        """The method, admission and time limit of a route (the router's route()), the call admitted; None: the
        route's cluster was retired meanwhile. The admission's error: refused."""
        subchannels, policy, admission, limit, (hashing, faults) = routed
        router = self._channel._router
        generation = router.generation
        if generation != self._generation:
            for stale in [key for key in list(self._methods) if not router.holds(*key)]:
                self._methods.pop(stale, None)  # (in place: a method another thread is adding stays)
            self._channel._state.keep_routes(router.policies())
            self._generation = generation
        key = (subchannels, policy, hashing, faults)
        method = self._methods.get(key)
        if method is None:
            cluster = Cluster(self._channel, self._channel._state.routed(policy), subchannels, admission,
                              None if hashing is None else (hashing, router.channel_id),
                              functools.partial(router.faults, faults) if faults else None)
            method = self._methods[key] = self._make(cluster, self._method, self._serializer, self._deserializer,
                                                     self._kind, *self._extra)
        # (last: nothing after it may raise, or the call's place in the cluster would never be freed)
        if not admission.admit():
            self._methods.pop(key, None)  # (made for a retired cluster: no call will use it)
            return None
        return method, admission, limit


def bounded(timeout: Optional[float], limit: Optional[float]) -> Optional[float]:
    """A call's timeout within its route's limit (gRFC A31)."""
    return timeout if limit is None or (timeout is not None and timeout <= limit) else limit


def start_failed(error: Exception, channel: Any) -> Tuple[grpc.StatusCode, str]:
    """The status of a call made before its channel's first config whose start raised once the config came: too
    late to raise where the call was made, as it would have been then, so the call ends with it instead. CANCELLED
    if the channel closed meanwhile (as grpcio's calls do then); an RpcError's own status; else INTERNAL, naming
    the error (logged: it is a fault of the application's arguments or of grpc_retry)."""
    if channel._state.closed or channel._router.closed:
        return grpc.StatusCode.CANCELLED, CLOSED_DETAILS
    if isinstance(error, grpc.RpcError) and callable(getattr(error, "code", None)):
        return error.code(), error.details() or ""
    log.error("a call made before the channel's first config could not start", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"grpc_retry could not start the call: {error!r}"
