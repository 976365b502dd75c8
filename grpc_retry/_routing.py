"""What both channels on `xds:` targets share (sync/_xds.py, aio/_xds.py): each method of the channel makes, per
cluster and route policy, a method of the flavor's own (its _MultiCallable) that runs the calls routed there as
any other channel's, on that cluster's subchannels."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from grpc_retry._method import Deserializer, Serializer


class Cluster:
    """What a method reads of its channel: a cluster's subchannels, under one route's view of the channel state,
    and the channel's own workers (sync) or call timers (aio)."""

    __slots__ = ("_state", "_subchannels", "_workers", "_timers")

    def __init__(self, channel: Any, state: Any, subchannels: Any) -> None:
        self._state, self._subchannels = state, subchannels
        self._workers, self._timers = getattr(channel, "_workers", None), getattr(channel, "_timers", None)


class RoutedMethod:
    """One method of an xDS channel: per call, the method of its route's cluster that makes the call."""

    __slots__ = ("_channel", "_method", "_serializer", "_deserializer", "_kind", "_make", "_extra", "_methods")

    def __init__(self, channel: Any, method: str, serializer: Serializer, deserializer: Deserializer, kind: str,
                 make: Callable[..., Any], *extra: Any) -> None:
        self._channel = channel
        self._method, self._serializer, self._deserializer, self._kind = method, serializer, deserializer, kind
        self._make, self._extra = make, extra  # the flavor's method class, and what else it takes
        self._methods: Dict[Tuple[int, Any], Any] = {}

    def method_of(self, routed: Tuple[Any, Any, Any, Optional[float]]) -> Tuple[Any, Any, Optional[float]]:
        """The method, Gate and time limit of a route (XdsRouter.route), the call admitted (RouteError:
        dropped)."""
        subchannels, policy, gate, limit = routed
        gate.admit()
        key = (id(subchannels), policy)
        method = self._methods.get(key)
        if method is None:
            cluster = Cluster(self._channel, self._channel._state.routed(policy), subchannels)
            method = self._methods[key] = self._make(cluster, self._method, self._serializer, self._deserializer,
                                                     self._kind, *self._extra)
        return method, gate, limit


def bounded(timeout: Optional[float], limit: Optional[float]) -> Optional[float]:
    """A call's timeout within its route's limit (gRFC A31)."""
    return timeout if limit is None or (timeout is not None and timeout <= limit) else limit
