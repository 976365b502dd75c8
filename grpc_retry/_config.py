"""The `grpc.service_config` channel option: parse and validate its JSON (gRFC A6), report every error.

The schema is third_party/service_config.proto. The walk over the decoded JSON is our own so that it
can collect all errors with their field paths; durations are checked with protobuf's proto3 JSON mapping
of Duration. Unknown fields are ignored and JSON null counts as absent, as in gRPC. The result is a tree
of frozen dataclasses.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, TypeVar

from google.protobuf import duration_pb2

__all__ = [
    "EMPTY_SERVICE_CONFIG",
    "LB_POLICIES",
    "STATUS_CODE_NAMES",
    "HedgingPolicy",
    "MethodConfig",
    "RetryPolicy",
    "RetryThrottling",
    "ServiceConfig",
    "ServiceConfigError",
    "parse_service_config",
]

# Index = status code number.
STATUS_CODE_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)
LB_POLICIES = ("pick_first", "round_robin")

_STATUS_CODES = {name: code for code, name in enumerate(STATUS_CODE_NAMES)}
_DURATION = re.compile(r"-?[0-9]+(\.[0-9]{1,9})?s")  # proto3 JSON: seconds, up to 9 fractional digits, "s"
_INTEGER = re.compile(r"-?[0-9]+")  # proto3 JSON also takes integers as strings
_UINT32_MAX = 2**32 - 1
_MILLI = Decimal("0.001")
_T = TypeVar("_T")


class ServiceConfigError(ValueError):
    """An invalid service config; `errors` lists every problem as "path: reason"."""

    errors: list[str]

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid service config: " + "; ".join(self.errors))


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int  # already clamped to the client cap
    initial_backoff: float  # seconds
    max_backoff: float  # seconds
    backoff_multiplier: float
    retryable_status_codes: frozenset[int]


@dataclass(frozen=True)
class HedgingPolicy:
    max_attempts: int  # already clamped to the client cap
    hedging_delay: float  # seconds; 0.0 when absent
    non_fatal_status_codes: frozenset[int]


@dataclass(frozen=True)
class MethodConfig:
    retry_policy: Optional[RetryPolicy] = None
    hedging_policy: Optional[HedgingPolicy] = None
    timeout: Optional[float] = None  # seconds
    wait_for_ready: Optional[bool] = None
    max_request_message_bytes: Optional[int] = None
    max_response_message_bytes: Optional[int] = None


@dataclass(frozen=True)
class RetryThrottling:
    max_tokens: float
    token_ratio: float
    max_milli_tokens: int  # exactly max_tokens * 1000
    milli_token_ratio: int  # exactly token_ratio * 1000


@dataclass(frozen=True)
class ServiceConfig:
    retry_throttling: Optional[RetryThrottling] = None
    lb_policy: Optional[str] = None  # "pick_first" | "round_robin" | None
    # Keys: "/service/method" (exact), "/service/" (whole service), "" (the default config).
    method_configs: Mapping[str, MethodConfig] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, repr=False)

    def method_config(self, method: str) -> Optional[MethodConfig]:
        """The config for the full method path "/pkg.Service/Method": exact, else service, else default."""
        table = self.method_configs
        config = table.get(method)
        if config is None:
            config = table.get(method[: method.rfind("/") + 1])
            if config is None:
                config = table.get("")
        return config


EMPTY_SERVICE_CONFIG = ServiceConfig()


def parse_service_config(text: Optional[str], *, max_attempts_cap: int = 5) -> ServiceConfig:
    """Parse the JSON service config; raise ServiceConfigError listing every problem."""
    if max_attempts_cap < 1:
        raise ValueError(f"max_attempts_cap must be at least 1, got {max_attempts_cap}")
    if text is None or text == "":
        return EMPTY_SERVICE_CONFIG
    try:
        doc = json.loads(text, parse_float=Decimal, parse_constant=_reject_constant)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ServiceConfigError([f"<root>: invalid JSON: {exc}"]) from None
    parser = _Parser(max_attempts_cap)
    config = parser.service_config(doc)
    if parser.errors or config is None:
        raise ServiceConfigError(parser.errors)
    return config


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Parser:
    """Walks the decoded JSON; each method returns the parsed value, or None after recording errors."""

    def __init__(self, max_attempts_cap: int) -> None:
        self.cap = max_attempts_cap
        self.errors: list[str] = []

    def error(self, path: str, reason: str) -> None:
        self.errors.append(f"{path}: {reason}")

    def get(self, obj: dict[str, Any], path: str, key: str, kind: Callable[[Any, str], Optional[_T]],
            required: bool = False) -> Optional[_T]:
        path = f"{path}.{key}" if path else key
        value = obj.get(key)
        if value is None:
            if required:
                self.error(path, "is required")
            return None
        return kind(value, path)

    def check(self, value: Optional[_T], path: str, ok: Callable[[_T], bool], reason: str) -> Optional[_T]:
        if value is not None and not ok(value):
            self.error(path, reason)
            return None
        return value

    # JSON types

    def json_object(self, value: Any, path: str) -> Optional[dict[str, Any]]:
        if isinstance(value, dict):
            return value
        return self.error(path, "must be an object")

    def json_list(self, value: Any, path: str) -> Optional[list[Any]]:
        if isinstance(value, list):
            return value
        return self.error(path, "must be a list")

    def json_string(self, value: Any, path: str) -> Optional[str]:
        if isinstance(value, str):
            return value
        return self.error(path, "must be a string")

    def json_bool(self, value: Any, path: str) -> Optional[bool]:
        if isinstance(value, bool):
            return value
        return self.error(path, "must be a boolean")

    def integer(self, value: Any, path: str) -> Optional[int]:
        if isinstance(value, str) and _INTEGER.fullmatch(value):
            try:
                value = int(value)
            except ValueError:  # more digits than Python converts
                pass
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return self.error(path, "must be an integer")

    def number(self, value: Any, path: str) -> Optional[Decimal]:
        if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
            return Decimal(value)
        return self.error(path, "must be a number")

    def duration(self, value: Any, path: str) -> Optional[float]:
        """A proto3 JSON Duration such as "1.5s", in seconds."""
        if not isinstance(value, str):
            return self.error(path, "must be a string")
        if not _DURATION.fullmatch(value):
            return self.error(path, f'invalid duration {value!r} (expected e.g. "1.5s")')
        try:
            duration_pb2.Duration().FromJsonString(value)
        except ValueError:
            return self.error(path, f"duration {value!r} is out of range")
        return float(value[:-1])

    # The schema

    def service_config(self, doc: Any) -> Optional[ServiceConfig]:
        root = self.json_object(doc, "<root>")
        if root is None:
            return None
        table: dict[str, MethodConfig] = {}
        for i, entry in enumerate(self.get(root, "", "methodConfig", self.json_list) or ()):
            self.method_config(entry, f"methodConfig[{i}]", table)
        throttling = self.get(root, "", "retryThrottling", self.retry_throttling)
        policy = self.get(root, "", "loadBalancingPolicy", self.lb_policy_name)
        lb_config = self.get(root, "", "loadBalancingConfig", self.lb_config)
        return ServiceConfig(throttling, lb_config or policy, MappingProxyType(table))

    def method_config(self, value: Any, path: str, table: dict[str, MethodConfig]) -> None:
        obj = self.json_object(value, path)
        if obj is None:
            return
        names = []
        for j, name in enumerate(self.get(obj, path, "name", self.json_list) or ()):
            key = self.name_key(name, f"{path}.name[{j}]")
            if key is not None:
                names.append((key, f"{path}.name[{j}]"))
        retry = self.get(obj, path, "retryPolicy", self.retry_policy)
        hedging = self.get(obj, path, "hedgingPolicy", self.hedging_policy)
        if obj.get("retryPolicy") is not None and obj.get("hedgingPolicy") is not None:
            self.error(path, "retryPolicy and hedgingPolicy are mutually exclusive")
        timeout = self.check(self.get(obj, path, "timeout", self.duration), f"{path}.timeout",
                             lambda t: t >= 0, "must not be negative")
        config = MethodConfig(
            retry_policy=retry,
            hedging_policy=hedging,
            timeout=timeout,
            wait_for_ready=self.get(obj, path, "waitForReady", self.json_bool),
            max_request_message_bytes=self.message_bytes(obj, path, "maxRequestMessageBytes"),
            max_response_message_bytes=self.message_bytes(obj, path, "maxResponseMessageBytes"),
        )
        for key, name_path in names:
            if key in table:
                self.error(name_path, "duplicate default name" if key == "" else f"duplicate name {key!r}")
            else:
                table[key] = config

    def name_key(self, value: Any, path: str) -> Optional[str]:
        """The lookup key of a name: "/service/method", "/service/" or "" (default)."""
        obj = self.json_object(value, path)
        if obj is None:
            return None
        n_errors = len(self.errors)
        service = self.get(obj, path, "service", self.json_string) or ""
        method = self.get(obj, path, "method", self.json_string) or ""
        if len(self.errors) > n_errors:
            return None
        if not service:
            return self.error(path, "method given without service") if method else ""
        return f"/{service}/{method}"

    def message_bytes(self, obj: dict[str, Any], path: str, key: str) -> Optional[int]:
        return self.check(self.get(obj, path, key, self.integer), f"{path}.{key}",
                          lambda n: 0 <= n <= _UINT32_MAX, f"must be in [0, {_UINT32_MAX}]")

    def retry_policy(self, value: Any, path: str) -> Optional[RetryPolicy]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        max_attempts = self.max_attempts(obj, path)
        initial, maximum = (
            self.check(self.get(obj, path, key, self.duration, required=True), f"{path}.{key}",
                       lambda t: t > 0, "must be greater than 0")
            for key in ("initialBackoff", "maxBackoff"))
        multiplier = self.get(obj, path, "backoffMultiplier", self.number, required=True)
        multiplier_f = None if multiplier is None else float(multiplier)
        multiplier_f = self.check(multiplier_f, f"{path}.backoffMultiplier", lambda m: m > 0,
                                  "must be greater than 0")
        multiplier_f = self.check(multiplier_f, f"{path}.backoffMultiplier", math.isfinite, "is too large")
        codes = self.status_codes(obj, path, "retryableStatusCodes", "OK cannot be retryable")
        if max_attempts is None or initial is None or maximum is None or multiplier_f is None \
                or codes is None:
            return None
        return RetryPolicy(max_attempts, initial, maximum, multiplier_f, codes)

    def hedging_policy(self, value: Any, path: str) -> Optional[HedgingPolicy]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        max_attempts = self.max_attempts(obj, path)
        delay = self.check(self.get(obj, path, "hedgingDelay", self.duration), f"{path}.hedgingDelay",
                           lambda t: t >= 0, "must not be negative")
        codes = self.status_codes(obj, path, "nonFatalStatusCodes", "OK cannot be non-fatal")
        if max_attempts is None or codes is None or (delay is None and obj.get("hedgingDelay") is not None):
            return None
        return HedgingPolicy(max_attempts, 0.0 if delay is None else delay, codes)

    def max_attempts(self, obj: dict[str, Any], path: str) -> Optional[int]:
        attempts = self.get(obj, path, "maxAttempts", self.integer, required=True)
        attempts = self.check(attempts, f"{path}.maxAttempts", lambda n: n >= 2, "must be at least 2")
        return None if attempts is None else min(attempts, self.cap)

    def status_codes(self, obj: dict[str, Any], path: str, key: str,
                     ok_reason: str) -> Optional[frozenset[int]]:
        items = self.get(obj, path, key, self.json_list, required=True)
        if items is None:
            return None
        if not items:
            return self.error(f"{path}.{key}", "must be non-empty")
        n_errors = len(self.errors)
        codes = set()
        for i, item in enumerate(items):
            item_path = f"{path}.{key}[{i}]"
            if isinstance(item, str):
                code = _STATUS_CODES.get(item)
            elif isinstance(item, int) and not isinstance(item, bool):
                code = item if 0 <= item < len(STATUS_CODE_NAMES) else None
            else:
                self.error(item_path, "must be a status code name or number")
                continue
            if code is None:
                self.error(item_path, f"unknown status code {item!r}")
            elif code == 0:
                self.error(item_path, ok_reason)
            else:
                codes.add(code)
        return frozenset(codes) if len(self.errors) == n_errors else None

    def retry_throttling(self, value: Any, path: str) -> Optional[RetryThrottling]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        max_milli = self.get(obj, path, "maxTokens", lambda v, p: self.milli(v, p, 1000), True)
        ratio_milli = self.get(obj, path, "tokenRatio", lambda v, p: self.milli(v, p, _UINT32_MAX), True)
        if max_milli is None or ratio_milli is None:
            return None
        return RetryThrottling(max_milli / 1000, ratio_milli / 1000, max_milli, ratio_milli)

    def milli(self, value: Any, path: str, limit: int) -> Optional[int]:
        """A number in (0, limit] with at most 3 decimal places, as an exact count of thousandths."""
        number = self.number(value, path)
        number = self.check(number, path, lambda d: d > 0, "must be greater than 0")
        number = self.check(number, path, lambda d: d <= limit, f"must be at most {limit}")
        number = self.check(number, path, lambda d: d == d.quantize(_MILLI),
                            "must have at most 3 decimal places")
        return None if number is None else int(number.scaleb(3))

    def lb_policy_name(self, value: Any, path: str) -> Optional[str]:
        name = self.json_string(value, path)
        return self.check(None if name is None else name.lower(), path, lambda n: n in LB_POLICIES,
                          f"unsupported policy {name!r} (supported: {', '.join(LB_POLICIES)})")

    def lb_config(self, value: Any, path: str) -> Optional[str]:
        items = self.json_list(value, path)
        if items is None:
            return None
        chosen = None
        for i, item in enumerate(items):
            item_path = f"{path}[{i}]"
            entry = self.json_object(item, item_path)
            if entry is None:
                continue
            if len(entry) != 1:
                self.error(item_path, "must have exactly one key (the policy name)")
                continue
            ((name, policy_config),) = entry.items()
            if self.json_object(policy_config, f"{item_path}.{name}") is not None and chosen is None \
                    and name in LB_POLICIES:
                chosen = name
        if chosen is None:
            self.error(path, f"no supported policy (supported: {', '.join(LB_POLICIES)})")
        return chosen
