"""Client-side health checking, gRFC A17: with `healthCheckConfig` in the service config, each connected
subchannel watches `grpc.health.v1.Health/Watch` for the configured service, and counts as READY only while the
backend says SERVING (CONNECTING until its first answer, TRANSIENT_FAILURE otherwise): the pickers then give it
no attempt. A backend that answers UNIMPLEMENTED is taken as healthy, with no more watching (logged once per
channel). A watch that ends otherwise leaves the subchannel in TRANSIENT_FAILURE and is started again after an
exponential backoff, at once after one that had answered. `("grpc.inhibit_health_checking", 1)` turns it off,
as on grpcio. Unlike gRPC's pick_first (A17 leaves it out), both pickers honour it.

The watch is the flavor's (sync.py: a thread per watch; aio.py: a task); the decisions are here."""

from __future__ import annotations

import logging
import random
from typing import Any, Optional

from grpc_retry._proto import health_pb2  # generated from third_party/health.proto when the package is built

log = logging.getLogger("grpc_retry")

WATCH = "/grpc.health.v1.Health/Watch"
INHIBIT = "grpc.inhibit_health_checking"

# What a subchannel's health is, for the picker.
UNANSWERED = None  # watching, no answer yet: CONNECTING
HEALTHY = True
UNHEALTHY = False

# Between two watches that ended without an answer (C-core's health check client uses its connection backoff).
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 120.0
MULTIPLIER = 1.6
JITTER = 0.2


_messages: Any = health_pb2  # (generated: no type stubs)


def request(service: str) -> bytes:
    return bytes(_messages.HealthCheckRequest(service=service).SerializeToString())


def healthy(response: bytes) -> bool:
    status = _messages.HealthCheckResponse.FromString(response).status
    return bool(status == _messages.HealthCheckResponse.SERVING)


class Backoff:
    """A17: exponential backoff between watches; a watch that got an answer resets it."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0.0

    def answered(self) -> None:
        self._next = 0.0

    def delay(self) -> float:
        delay = self._next
        self._next = INITIAL_BACKOFF if delay == 0 else min(delay * MULTIPLIER, MAX_BACKOFF)
        return delay * (1 + JITTER * (2 * random.random() - 1))


def service_name(config_service: Optional[str], passthrough: dict[str, object]) -> Optional[str]:
    """The service to watch, or None when health checking is off (no config, or inhibited)."""
    if config_service is None or passthrough.get(INHIBIT) in (1, True):
        return None
    return config_service


class Unimplemented:
    """Logs once per channel that its backends do not serve the health service (A17: a trace event)."""

    __slots__ = ("_logged",)

    def __init__(self) -> None:
        self._logged = False

    def note(self, target: str) -> None:
        if not self._logged:
            self._logged = True
            log.warning("health checking: a backend of %r answers Health/Watch with UNIMPLEMENTED: taken as "
                        "healthy, as gRFC A17 says", target)
