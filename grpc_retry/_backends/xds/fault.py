"""xDS fault injection (gRFC A33): the HTTP fault filter's delays and aborts, as grpcio's C-core reads and runs
them. A fault applies once per call, above its retries (as in grpcio: an aborted call sends no attempt and is not
retried), after its route and cluster are chosen: the call's first attempt waits out the delay (its deadline
running), then the call aborts with the configured status ("Fault injected"), or goes on.

- Config: `fixed_delay` or `header_delay`; `abort` as a gRPC status (0: none), an HTTP status mapped as gRPC maps
  it (200: none), or `header_abort`; each with its percentage (none given: never); `max_active_faults` (none:
  no limit). Other fields are ignored, as grpcio ignores them.
- Headers (with `header_delay` / `header_abort` only): `x-envoy-fault-delay-request` (milliseconds, when no fixed
  delay), `x-envoy-fault-abort-grpc-request` (a status code, when no configured one; not a number, or out of
  range: UNKNOWN), and `x-envoy-fault-delay-request-percentage` / `x-envoy-fault-abort-percentage`, which can
  lower the configured percentage, never raise it.
- Delay and abort are drawn independently. Faults active at once (calls in a delay) are counted for the process:
  at `max_active_faults`, a drawn delay is skipped, and an abort with no delay drawn is too.
- Per-route overrides (`typed_per_filter_config` of the weighted cluster, else the route, else the virtual host)
  replace the listener's config of the filter of that name whole, or disable it.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from grpc_retry._backends.xds.errors import Errors
from grpc_retry._backends.xds.hash_policy import header_value
from grpc_retry._timer import TIMERS

FAULT = "envoy.extensions.filters.http.fault.v3.HTTPFault"
FILTER_CONFIG = "envoy.config.route.v3.FilterConfig"
DELAY_HEADER = "x-envoy-fault-delay-request"
DELAY_PERCENT_HEADER = "x-envoy-fault-delay-request-percentage"
ABORT_HEADER = "x-envoy-fault-abort-grpc-request"
ABORT_PERCENT_HEADER = "x-envoy-fault-abort-percentage"
UNKNOWN = 2
_DENOMINATORS = {0: 100, 1: 10_000, 2: 1_000_000}  # HUNDRED, TEN_THOUSAND, MILLION
# HTTP statuses as gRPC maps them to its own; any other: UNKNOWN
_HTTP = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}
_NO_LIMIT = 2**32 - 1
_MAX_SECONDS = 315576000000


@dataclass(frozen=True)
class Fault:
    delay: float = 0.0  # seconds (0: none)
    delay_share: Tuple[int, int] = (0, 100)  # numerator, denominator
    delay_header: bool = False
    abort_code: int = 0  # (0: none)
    abort_share: Tuple[int, int] = (0, 100)
    abort_header: bool = False
    max_faults: int = _NO_LIMIT


class _Active:
    """The faults in a delay now, for the process (as grpcio counts them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def enter(self, limit: int, delay: float) -> bool:
        with self._lock:
            if self.count >= limit:
                return False
            self.count += 1
        TIMERS.schedule(delay, self._leave, shared=True)
        return True

    def _leave(self) -> None:
        with self._lock:
            self.count -= 1


ACTIVE = _Active()


def decide(faults: Sequence[Fault], metadata: Optional[Sequence[Tuple[str, Any]]],
           rng: Any = random) -> Tuple[float, int]:
    """A call's faults: the delay its first attempt waits (seconds) and the status it then ends with (0: none)."""
    total = 0.0
    for fault in faults:
        delay, delay_share = fault.delay, fault.delay_share
        code, abort_share = fault.abort_code, fault.abort_share
        if fault.delay_header:
            if delay == 0:
                millis = _integer(header_value(metadata, DELAY_HEADER))
                delay = millis / 1000 if millis is not None and millis > 0 else 0.0
            delay_share = _lowered(delay_share, header_value(metadata, DELAY_PERCENT_HEADER))
        if fault.abort_header:
            if code == 0:
                text = header_value(metadata, ABORT_HEADER)
                if text is not None:
                    number = _integer(text)
                    code = number if number is not None and 0 <= number <= 16 else UNKNOWN
            abort_share = _lowered(abort_share, header_value(metadata, ABORT_PERCENT_HEADER))
        delayed = delay > 0 and _drawn(delay_share, rng)
        aborted = code != 0 and _drawn(abort_share, rng)
        if delayed and ACTIVE.enter(fault.max_faults, delay):
            total += delay
        if aborted and (delayed or ACTIVE.count < fault.max_faults):
            return total, code
    return total, 0


def _drawn(share: Tuple[int, int], rng: Any) -> bool:
    numerator, denominator = share
    return numerator > 0 and (numerator >= denominator or rng.randrange(denominator) < numerator)


def _lowered(share: Tuple[int, int], text: Optional[str]) -> Tuple[int, int]:
    number = _integer(text)
    if number is None or not 0 <= number < 2**32:
        return share
    return min(number, share[0]), share[1]


def _integer(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse(data: bytes, at: str, errors: Errors) -> Optional[Fault]:
    """An HTTPFault (the listener's filter config or a route's override) as grpcio reads it."""
    from envoy.extensions.filters.http.fault.v3 import fault_pb2

    message = fault_pb2.HTTPFault()
    try:
        message.ParseFromString(data)
    except Exception:  # noqa: BLE001
        errors.add(at, "could not parse fault injection filter config")
        return None
    fields: dict[str, Any] = {}
    if message.HasField("abort"):
        abort = message.abort
        kind = abort.WhichOneof("error_type")
        if kind == "grpc_status" and abort.grpc_status != 0:
            if abort.grpc_status > 16:
                errors.add(f"{at}.abort.grpc_status", f"invalid gRPC status code: {abort.grpc_status}")
                return None
            fields["abort_code"] = abort.grpc_status
        elif kind == "http_status" and abort.http_status not in (0, 200):
            fields["abort_code"] = _HTTP.get(abort.http_status, UNKNOWN)
        elif kind == "header_abort":
            fields["abort_header"] = True
        fields["abort_share"] = _share(abort, "percentage")
    if message.HasField("delay"):
        delay = message.delay
        kind = delay.WhichOneof("fault_delay_secifier")
        if kind == "fixed_delay":
            value = delay.fixed_delay
            if not 0 <= value.seconds <= _MAX_SECONDS:
                errors.add(f"{at}.delay.fixed_delay.seconds", f"value must be in the range [0, {_MAX_SECONDS}]")
                return None
            if not 0 <= value.nanos <= 999_999_999:
                errors.add(f"{at}.delay.fixed_delay.nanos", "value must be in the range [0, 999999999]")
                return None
            fields["delay"] = value.seconds + value.nanos / 1e9
        elif kind == "header_delay":
            fields["delay_header"] = True
        fields["delay_share"] = _share(delay, "percentage")
    if message.HasField("max_active_faults"):
        fields["max_faults"] = message.max_active_faults.value
    return Fault(**fields)


def _share(message: Any, field: str) -> Tuple[int, int]:
    if not message.HasField(field):
        return 0, 100
    percent = getattr(message, field)
    return percent.numerator, _DENOMINATORS.get(percent.denominator, 100)


def override(packed: Any, at: str, errors: Errors) -> Tuple[bool, Optional[Fault]]:
    """A `typed_per_filter_config` entry: (whether it is a fault filter's, its config; None: the filter is
    disabled there). Another filter's entry is not ours: (False, None)."""
    kind = packed.type_url.rsplit("/", 1)[-1]
    if kind == FILTER_CONFIG:
        from envoy.config.route.v3 import route_components_pb2

        wrapper = route_components_pb2.FilterConfig()
        try:
            wrapper.ParseFromString(packed.value)
        except Exception:  # noqa: BLE001
            errors.add(at, "could not parse FilterConfig")
            return False, None
        if not wrapper.HasField("config"):
            errors.add(f"{at}.config", "field not present")
            return False, None
        inner = wrapper.config.type_url.rsplit("/", 1)[-1]
        if inner != FAULT:
            return False, None
        if wrapper.disabled:
            return True, None
        return True, parse(wrapper.config.value, f"{at}.config.value[{FAULT}]", errors)
    if kind != FAULT:
        return False, None
    return True, parse(packed.value, f"{at}.value[{FAULT}]", errors)
