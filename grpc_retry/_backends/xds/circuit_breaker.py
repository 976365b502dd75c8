"""A cluster's circuit breaker (gRFC A32): at most `max_requests` calls in flight, those over it failing at once.
Its count of calls in flight also tells when a retired cluster has none left, to close it."""

from __future__ import annotations

import threading
from typing import Callable, Optional

from grpc_retry._backends.xds.clusters import DEFAULT_MAX_REQUESTS
from grpc_retry._backends.xds.errors import RouteError


class CircuitBreaker:
    __slots__ = ("max_requests", "inflight", "_lock", "retired", "_drained")

    def __init__(self) -> None:
        self.max_requests = DEFAULT_MAX_REQUESTS  # (the CDS update sets it)
        self.inflight = 0
        self._lock = threading.Lock()
        self.retired = False
        self._drained: Optional[Callable[[], None]] = None  # told once a retired cluster's last call has ended

    def admit(self) -> bool:
        """A call enters (release() when it ends); False: the cluster is retired. RouteError: it is full."""
        with self._lock:
            if self.retired:
                return False
            if self.inflight >= self.max_requests:
                raise RouteError("circuit breaker drop")
            self.inflight += 1
        return True

    def release(self) -> None:
        drained = None
        with self._lock:
            self.inflight -= 1
            if self.inflight == 0 and self._drained is not None:
                drained, self._drained = self._drained, None
        if drained is not None:
            drained()

    def retire(self, drained: Callable[[], None]) -> None:
        """No call enters any more; `drained` is told once none is left in flight (now, if none is)."""
        with self._lock:
            self.retired = True
            if self.inflight:
                self._drained = drained
                return
        drained()
