"""The `grpc.service_config` channel option: parse and validate its JSON (gRFC A6), report every error.

The schema is third_party/service_config.proto. The walk over the decoded JSON is our own so that it
can collect all errors with their field paths (_json.py reads JSON as proto3's JSON mapping writes it: durations,
numbers as strings). Unknown fields are ignored and
JSON null counts as absent, as in gRPC; but an unknown key is most often a misspelt one, so each is reported as
a warning (with the known key it is closest to), as is a name that can never match a method. Whatever the
text, the parser returns a config or raises ServiceConfigError. The result is a tree of frozen dataclasses.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Decimal
from types import MappingProxyType
from typing import Any, Mapping, Optional, Tuple

from grpc_retry._json import JsonReader, cut, decode, listing
from grpc_retry._json import show as _show
from grpc_retry._suggest import closest, did_you_mean, hint

log = logging.getLogger("grpc_retry")

__all__ = [
    "EMPTY_SERVICE_CONFIG",
    "LB_POLICIES",
    "STATUS_CODE_NAMES",
    "FailurePercentageEjection",
    "HedgingPolicy",
    "MethodConfig",
    "OutlierDetection",
    "RetryPolicy",
    "RetryThrottling",
    "ServiceConfig",
    "ServiceConfigError",
    "ServiceConfigWarning",
    "SuccessRateEjection",
    "parse_service_config",
]

# Index = status code number.
STATUS_CODE_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)
LB_POLICIES = ("pick_first", "round_robin")
OUTLIER_DETECTION = "outlier_detection_experimental"  # the name C-core registers for A50's policy
RING_HASH = "ring_hash_experimental"  # A42's policy, as C-core registers it (ServiceConfig.lb_policy "ring_hash")
MAX_RING_SIZE = 8388608
# Policies other gRPC clients implement: skipped as any unknown name, but never "corrected" to one of ours.
_OTHER_LB_POLICIES = frozenset((
    "grpclb", "weighted_round_robin", "least_request_experimental", "rls_experimental",
    "priority_experimental", "weighted_target_experimental", "cds_experimental", "xds_cluster_impl_experimental",
    "xds_cluster_manager_experimental", "xds_cluster_resolver_experimental", "xds_override_host_experimental",
    "xds_wrr_locality_experimental", "pick_first_ignore_empty_updates", "autosharding_experimental"))

_STATUS_CODES = {name: code for code, name in enumerate(STATUS_CODE_NAMES)}
# proto3 JSON: seconds, up to 9 fractional digits, "s" (and ".01s", which grpc-go's published example writes)
_UINT32_MAX = 2**32 - 1
_MILLI = Decimal("0.001")


class ServiceConfigError(ValueError):
    """An invalid service config; `errors` lists every problem as "path: reason"."""

    __module__ = "grpc_retry"  # tracebacks name it as applications import it (pickle finds it there too)
    errors: list[str]

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid service config: " + listing(self.errors))

    def __reduce__(self) -> Tuple[Any, ...]:
        # Unpickling calls the class with self.args, the message: it takes the list.
        return type(self), (self.errors,), self.__dict__


class ServiceConfigWarning(UserWarning):
    """A service config that gRPC accepts but that likely does not say what was meant: unknown keys (gRPC
    ignores them: a misspelt one changes behaviour silently), names that can never match a method."""

    __module__ = "grpc_retry"


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int  # already clamped to the client cap
    initial_backoff: float  # seconds
    max_backoff: float  # seconds
    backoff_multiplier: float
    retryable_status_codes: frozenset[int]
    per_attempt_recv_timeout: Optional[float] = None  # seconds; None: attempts are not timed


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
class SuccessRateEjection:
    stdev_factor: int = 1900
    enforcement_percentage: int = 100
    minimum_hosts: int = 5
    request_volume: int = 100


@dataclass(frozen=True)
class FailurePercentageEjection:
    threshold: int = 85
    enforcement_percentage: int = 100
    minimum_hosts: int = 5
    request_volume: int = 50


@dataclass(frozen=True)
class OutlierDetection:
    """gRFC A50's `outlier_detection` policy config (seconds for durations); the child policy is the
    ServiceConfig's lb_policy."""

    interval: float = 10.0
    base_ejection_time: float = 30.0
    max_ejection_time: float = 300.0
    max_ejection_percent: int = 10
    success_rate: Optional[SuccessRateEjection] = None
    failure_percentage: Optional[FailurePercentageEjection] = None

    @property
    def counting(self) -> bool:
        """A50: with neither algorithm, calls are not counted and nothing is ejected."""
        return self.success_rate is not None or self.failure_percentage is not None


@dataclass(frozen=True)
class ServiceConfig:
    retry_throttling: Optional[RetryThrottling] = None
    lb_policy: Optional[str] = None  # "pick_first" | "round_robin" | "ring_hash" | None
    outlier_detection: Optional[OutlierDetection] = None
    health_check_service: Optional[str] = None  # healthCheckConfig.serviceName ("" is the whole server)
    # Keys: "/service/method" (exact), "/service/" (whole service), "" (the default config).
    method_configs: Mapping[str, MethodConfig] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, repr=False)
    # What gRPC accepts but that likely is a mistake, as "path: reason" (see ServiceConfigWarning).
    warnings: Tuple[str, ...] = field(default=(), compare=False, repr=False)
    ring_sizes: Tuple[int, int] = (1024, 4096)  # ring_hash: minRingSize, maxRingSize

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
        doc = decode(text)
    except RecursionError:
        raise ServiceConfigError(["<root>: invalid JSON: nested too deeply"]) from None
    except (ValueError, TypeError) as exc:
        raise ServiceConfigError([f"<root>: invalid JSON: {cut(str(exc))}"]) from None
    parser = _Parser(max_attempts_cap)
    parser.duplicates(doc)
    try:
        config = parser.service_config(doc)
    except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:  # a case the walk did not foresee
        parser.error("<root>", f"cannot be read: {cut(str(exc))}")
        config = None
    if parser.errors or config is None:
        raise ServiceConfigError(parser.errors)
    return config


def _policy_near(name: str, ours: Tuple[str, ...]) -> Optional[str]:
    """The policy of `ours` that `name` is likely a misspelling of; None for a policy other gRPC clients have."""
    return None if name.lower() in _OTHER_LB_POLICIES else closest(name, ours)


# The keys gRPC knows in each object of the schema (some of which grpc_retry does not use).
_KNOWN = {
    "<root>": ("methodConfig", "retryThrottling", "loadBalancingPolicy", "loadBalancingConfig",
               "healthCheckConfig"),
    "methodConfig": ("name", "waitForReady", "timeout", "maxRequestMessageBytes", "maxResponseMessageBytes",
                     "retryPolicy", "hedgingPolicy"),
    "name": ("service", "method"),
    "retryPolicy": ("maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier", "retryableStatusCodes",
                    "perAttemptRecvTimeout"),
    "hedgingPolicy": ("maxAttempts", "hedgingDelay", "nonFatalStatusCodes"),
    "retryThrottling": ("maxTokens", "tokenRatio"),
    "healthCheckConfig": ("serviceName",),
    RING_HASH: ("minRingSize", "maxRingSize"),
    OUTLIER_DETECTION: ("interval", "baseEjectionTime", "maxEjectionTime", "maxEjectionPercent",
                        "successRateEjection", "failurePercentageEjection", "childPolicy"),
    "successRateEjection": ("stdevFactor", "enforcementPercentage", "minimumHosts", "requestVolume"),
    "failurePercentageEjection": ("threshold", "enforcementPercentage", "minimumHosts", "requestVolume"),
}


class _Parser(JsonReader):
    """Walks the decoded JSON; each method returns the parsed value, or None after recording errors."""

    def __init__(self, max_attempts_cap: int) -> None:
        super().__init__()
        self.cap = max_attempts_cap

    # The schema

    def service_config(self, doc: Any) -> Optional[ServiceConfig]:
        root = self.json_object(doc, "<root>")
        if root is None:
            return None
        self.unknown_keys(root, "<root>", _KNOWN["<root>"])
        table: dict[str, MethodConfig] = {}
        for i, entry in enumerate(self.get(root, "", "methodConfig", self.json_list) or ()):
            self.method_config(entry, f"methodConfig[{i}]", table)
        throttling = self.get(root, "", "retryThrottling", self.retry_throttling)
        policy = self.get(root, "", "loadBalancingPolicy", self.lb_policy_name)
        lb_config = self.get(root, "", "loadBalancingConfig", self.lb_config)
        health = self.get(root, "", "healthCheckConfig", self.health_check)
        lb, outliers, ring_sizes = lb_config or (None, None, (1024, 4096))
        return ServiceConfig(throttling, lb or policy, outliers, health, MappingProxyType(table),
                             tuple(self.warnings), ring_sizes)

    def health_check(self, value: Any, path: str) -> Optional[str]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        self.unknown_keys(obj, path, _KNOWN["healthCheckConfig"])
        name = self.get(obj, path, "serviceName", self.json_string)
        return "" if name is None else name

    def method_config(self, value: Any, path: str, table: dict[str, MethodConfig]) -> None:
        obj = self.json_object(value, path)
        if obj is None:
            return
        self.unknown_keys(obj, path, _KNOWN["methodConfig"])
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
        if timeout == 0:
            timeout = None  # proto3's default value: unset
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
        self.unknown_keys(obj, path, _KNOWN["name"])
        n_errors = len(self.errors)
        service = self.get(obj, path, "service", self.json_string) or ""
        method = self.get(obj, path, "method", self.json_string) or ""
        if len(self.errors) > n_errors:
            return None
        if not service:
            if method:
                self.error(path, "method given without service")
                return None
            return ""
        if "/" in service or "/" in method:
            where = f"{path}.service" if "/" in service else f"{path}.method"
            self.warnings.append(f"{where}: {_show(service if '/' in service else method)} can never match a "
                                 'method (a name is {"service": "pkg.Service", "method": "Method"}, without "/")')
        return f"/{service}/{method}"

    def message_bytes(self, obj: dict[str, Any], path: str, key: str) -> Optional[int]:
        return self.check(self.get(obj, path, key, self.integer), f"{path}.{key}",
                          lambda n: 0 <= n <= _UINT32_MAX, f"must be in [0, {_UINT32_MAX}]")

    def retry_policy(self, value: Any, path: str) -> Optional[RetryPolicy]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        self.unknown_keys(obj, path, _KNOWN["retryPolicy"])
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
        # A timed attempt is retried whatever the codes say: with perAttemptRecvTimeout they may be empty (C-core).
        recv_timeout = self.check(self.get(obj, path, "perAttemptRecvTimeout", self.duration),
                                  f"{path}.perAttemptRecvTimeout", lambda t: t > 0, "must be greater than 0")
        timed = obj.get("perAttemptRecvTimeout") is not None
        codes = self.status_codes(obj, path, "retryableStatusCodes", "OK cannot be retryable", required=not timed)
        if max_attempts is None or initial is None or maximum is None or multiplier_f is None \
                or codes is None or timed and recv_timeout is None:
            return None
        return RetryPolicy(max_attempts, initial, maximum, multiplier_f, codes, recv_timeout)

    def hedging_policy(self, value: Any, path: str) -> Optional[HedgingPolicy]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        self.unknown_keys(obj, path, _KNOWN["hedgingPolicy"])
        max_attempts = self.max_attempts(obj, path)
        delay = self.check(self.get(obj, path, "hedgingDelay", self.duration), f"{path}.hedgingDelay",
                           lambda t: t >= 0, "must not be negative")
        # Optional (gRPC's service_config.proto): without it, every status but OK is fatal.
        codes = self.status_codes(obj, path, "nonFatalStatusCodes", "OK cannot be non-fatal", required=False)
        if max_attempts is None or codes is None or (delay is None and obj.get("hedgingDelay") is not None):
            return None
        return HedgingPolicy(max_attempts, 0.0 if delay is None else delay, codes)

    def max_attempts(self, obj: dict[str, Any], path: str) -> Optional[int]:
        attempts = self.get(obj, path, "maxAttempts", self.integer, required=True)
        attempts = self.check(attempts, f"{path}.maxAttempts", lambda n: n >= 2, "must be at least 2")
        attempts = self.check(attempts, f"{path}.maxAttempts", lambda n: n <= _UINT32_MAX,
                              f"must be at most {_UINT32_MAX} (a uint32)")
        return None if attempts is None else min(attempts, self.cap)

    def status_codes(self, obj: dict[str, Any], path: str, key: str, ok_reason: str,
                     required: bool) -> Optional[frozenset[int]]:
        items = self.get(obj, path, key, self.json_list, required=required)
        if items is None:
            return None if required else frozenset()
        if not items and required:
            self.error(f"{path}.{key}", "must be non-empty")
            return None
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
                # OK is never a valid entry: never the suggestion.
                meant = did_you_mean(item, STATUS_CODE_NAMES[1:]) if isinstance(item, str) else ""
                self.error(item_path, f"unknown status code {_show(item)}{meant}")
            elif code == 0:
                self.error(item_path, ok_reason)
            else:
                codes.add(code)
        return frozenset(codes) if len(self.errors) == n_errors else None

    def retry_throttling(self, value: Any, path: str) -> Optional[RetryThrottling]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        self.unknown_keys(obj, path, _KNOWN["retryThrottling"])
        max_milli = self.get(obj, path, "maxTokens", lambda v, p: self.milli(v, p, 1000, False), True)
        ratio_milli = self.get(obj, path, "tokenRatio", lambda v, p: self.milli(v, p, _UINT32_MAX, True), True)
        if max_milli is None or ratio_milli is None:
            return None
        return RetryThrottling(max_milli / 1000, ratio_milli / 1000, max_milli, ratio_milli)

    def milli(self, value: Any, path: str, limit: int, truncate: bool) -> Optional[int]:
        """A number in (0, limit] as an exact count of thousandths. `truncate`: further decimals are dropped, as
        gRPC's core does for tokenRatio; otherwise at most 3 decimal places."""
        number = self.number(value, path)
        number = self.check(number, path, lambda d: d > 0, "must be greater than 0")
        number = self.check(number, path, lambda d: d <= limit, f"must be at most {limit}")
        if number is not None and truncate:
            number = self.check(number.quantize(_MILLI, rounding=ROUND_DOWN), path, lambda d: d > 0,
                                "must be at least 0.001")
        number = self.check(number, path, lambda d: d == d.quantize(_MILLI),
                            "must have at most 3 decimal places")
        return None if number is None else int(number.scaleb(3))

    def lb_policy_name(self, value: Any, path: str) -> Optional[str]:
        name = self.json_string(value, path)
        if name == "":
            return None  # proto3's default value: unset
        near = None if name is None else _policy_near(name, LB_POLICIES)
        return self.check(None if name is None else name.lower(), path, lambda n: n in LB_POLICIES,
                          f"unsupported policy {_show(name)}"
                          + (hint(near) if near else f" (supported: {', '.join(LB_POLICIES)})"))

    def lb_config(self, value: Any, path: str
                  ) -> Optional[Tuple[str, Optional[OutlierDetection], Tuple[int, int]]]:
        """As gRPC: the first entry that names a policy this client implements wins, and the entries after it
        are not looked at; entries before it that name other policies are skipped. (policy, outlier detection,
        ring sizes)"""
        items = self.json_list(value, path)
        if items is None:
            return None
        skipped = []
        misspelt: dict[str, str] = {}  # skipped name -> our policy it is close to
        for i, item in enumerate(items):
            item_path = f"{path}[{i}]"
            entry = self.json_object(item, item_path)
            if entry is None:
                return None
            if len(entry) != 1:
                self.error(item_path, "must have exactly one key (the policy name)")
                return None
            ((name, policy_config),) = entry.items()
            if name not in LB_POLICIES and name != OUTLIER_DETECTION and name != RING_HASH:
                skipped.append(name)
                near = _policy_near(name, LB_POLICIES + (OUTLIER_DETECTION, RING_HASH))
                if near is not None:  # skipped as gRPC does; but most likely a typo of one that would be used
                    self.warnings.append(f"{item_path}.{name}: unknown policy, skipped{hint(near)}")
                    misspelt.setdefault(name, near)
                continue
            if self.json_object(policy_config, f"{item_path}.{name}") is None:
                return None
            if skipped:
                log.info("grpc_retry: loadBalancingConfig: using %s (not implemented here: %s)", name,
                         ", ".join(map(_show, skipped)))
            if name == OUTLIER_DETECTION:
                return self.outlier_detection(policy_config, f"{item_path}.{name}")
            if name == RING_HASH:
                return self.ring_hash(policy_config, f"{item_path}.{name}")
            return name, None, (1024, 4096)
        if misspelt:
            written, near = next(iter(misspelt.items()))
            self.error(path, f"no supported policy (found {_show(written)}: did you mean {near!r}?)")
        else:
            self.error(path, "no supported policy (supported: "
                             f"{', '.join(LB_POLICIES + (OUTLIER_DETECTION, RING_HASH))})")
        return None

    def ring_hash(self, obj: dict[str, Any], path: str) -> Optional[Tuple[str, None, Tuple[int, int]]]:
        """A42's config: each size 1 to 8388608, the minimum not above the maximum (defaults 1024 and 4096)."""
        self.unknown_keys(obj, path, _KNOWN[RING_HASH])
        low, high = (self.check(self.get(obj, path, key, self.integer), f"{path}.{key}",
                                lambda n: 1 <= n <= MAX_RING_SIZE, f"must be 1 to {MAX_RING_SIZE}")
                     for key in ("minRingSize", "maxRingSize"))
        if ("minRingSize" in obj and low is None) or ("maxRingSize" in obj and high is None):
            return None
        low, high = 1024 if low is None else low, 4096 if high is None else high
        if low > high:
            self.error(f"{path}.maxRingSize", "cannot be smaller than minRingSize")
            return None
        return "ring_hash", None, (low, high)

    def outlier_detection(self, obj: dict[str, Any], path: str
                          ) -> Optional[Tuple[str, Optional[OutlierDetection], Tuple[int, int]]]:
        """gRFC A50's config, validated as A50 says: durations not negative, percentages at most 100."""
        self.unknown_keys(obj, path, _KNOWN[OUTLIER_DETECTION])
        n_errors = len(self.errors)
        defaults = OutlierDetection()
        interval, base, longest = (
            self.check(self.get(obj, path, key, self.duration), f"{path}.{key}", lambda t: t >= 0,
                       "must not be negative")
            for key in ("interval", "baseEjectionTime", "maxEjectionTime"))
        percent = self.percent(obj, path, "maxEjectionPercent")
        success = self.get(obj, path, "successRateEjection", self.success_rate_ejection)
        failure = self.get(obj, path, "failurePercentageEjection", self.failure_percentage_ejection)
        child = self.get(obj, path, "childPolicy", self.lb_config, required=True)
        if len(self.errors) > n_errors or child is None:
            return None
        if child[1] is not None:
            self.error(f"{path}.childPolicy", f"{OUTLIER_DETECTION} cannot be its own child")
            return None
        base = defaults.base_ejection_time if base is None else base
        config = OutlierDetection(
            interval=defaults.interval if interval is None else interval,
            base_ejection_time=base,
            max_ejection_time=max(base, defaults.max_ejection_time) if longest is None else longest,
            max_ejection_percent=defaults.max_ejection_percent if percent is None else percent,
            success_rate=success, failure_percentage=failure)
        return child[0], config, child[2]

    def uint32(self, obj: dict[str, Any], path: str, key: str) -> Optional[int]:
        return self.check(self.get(obj, path, key, self.integer), f"{path}.{key}",
                          lambda n: 0 <= n <= _UINT32_MAX, f"must be in [0, {_UINT32_MAX}]")

    def percent(self, obj: dict[str, Any], path: str, key: str) -> Optional[int]:
        return self.check(self.uint32(obj, path, key), f"{path}.{key}", lambda n: n <= 100,
                          "must be at most 100")

    def success_rate_ejection(self, value: Any, path: str) -> Optional[SuccessRateEjection]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        self.unknown_keys(obj, path, _KNOWN["successRateEjection"])
        given = {"stdev_factor": self.uint32(obj, path, "stdevFactor"),
                 "enforcement_percentage": self.percent(obj, path, "enforcementPercentage"),
                 "minimum_hosts": self.uint32(obj, path, "minimumHosts"),
                 "request_volume": self.uint32(obj, path, "requestVolume")}
        return SuccessRateEjection(**{k: v for k, v in given.items() if v is not None})

    def failure_percentage_ejection(self, value: Any, path: str) -> Optional[FailurePercentageEjection]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        self.unknown_keys(obj, path, _KNOWN["failurePercentageEjection"])
        given = {"threshold": self.percent(obj, path, "threshold"),
                 "enforcement_percentage": self.percent(obj, path, "enforcementPercentage"),
                 "minimum_hosts": self.uint32(obj, path, "minimumHosts"),
                 "request_volume": self.uint32(obj, path, "requestVolume")}
        return FailurePercentageEjection(**{k: v for k, v in given.items() if v is not None})
