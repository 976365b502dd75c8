"""Channel options: the ones grpc_retry owns are validated and taken out; all others go to the subchannels."""

from __future__ import annotations

import functools
import json
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from grpc_retry._budget import RetryBudgetSettings, parse_retry_budget
from grpc_retry._config import ServiceConfig, ServiceConfigWarning, parse_service_config
from grpc_retry._suggest import closest, hint

SERVICE_CONFIG = "grpc.service_config"
ENABLE_RETRIES = "grpc.enable_retries"
PER_RPC_BUFFER = "grpc.per_rpc_retry_buffer_size"
CHANNEL_BUFFER = "grpc_retry.retry_buffer_size"
MAX_ATTEMPTS = "grpc_retry.max_attempts"
HEDGING_QUANTILE = "grpc_retry.hedging_quantile"
MAX_EXTRA_LOAD = "grpc_retry.max_extra_load"
RETRY_BUDGET = "grpc_retry.retry_budget"
LB_POLICY = "grpc.lb_policy_name"
ENABLE = "grpc_retry.enable"  # read by install()'s constructors; accepted (and ignored) by our channels
METER_PROVIDER = "grpc_retry.meter_provider"
TRACER_PROVIDER = "grpc_retry.tracer_provider"
DNS_REFRESH = "grpc_retry.dns_refresh_ms"
DNS_MIN_INTERVAL = "grpc.dns_min_time_between_resolutions_ms"  # gRPC's own: read, and passed on
CONNECTIONS = "grpc_retry.connections_per_address"
MAX_SERVER_DELAY = "grpc_retry.max_server_delay"
INHIBIT_HEALTH = "grpc.inhibit_health_checking"  # gRPC's own: read by the backends, and passed on

DEFAULT_PER_RPC_BUFFER = 256 * 1024
DEFAULT_CHANNEL_BUFFER = 16 * 1024 * 1024
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_DNS_REFRESH_MS = 30000
DEFAULT_DNS_MIN_INTERVAL_MS = 30000  # C-core's
DEFAULT_MAX_SERVER_DELAY = 30.0
LB_POLICIES = ("pick_first", "round_robin")
OURS = (CHANNEL_BUFFER, MAX_ATTEMPTS, HEDGING_QUANTILE, MAX_EXTRA_LOAD, ENABLE,  # the grpc_retry.* options
        METER_PROVIDER, TRACER_PROVIDER, DNS_REFRESH, CONNECTIONS, MAX_SERVER_DELAY, RETRY_BUDGET)

OptionsType = Optional[Sequence[Tuple[str, Any]]]

# Service configs parsed so far, by their text and attempt cap: a parse is ~40 us of a channel's ~80, and an
# application makes its channels with a few configs at most. The parse is frozen, so channels share it. Bounded:
# a process that makes configs on the fly starts over once PARSED_KEPT are held.
PARSED_KEPT = 64
_parsed: Dict[Tuple[str, int], ServiceConfig] = {}


@dataclass(frozen=True)
class RetryOptions:
    service_config: ServiceConfig
    enable_retries: bool
    per_rpc_buffer: int
    channel_buffer: int
    max_attempts: int
    hedging_quantile: float  # 0: A6's fixed hedgingDelay
    max_extra_load: float    # < 0: no budget
    lb_policy: str
    passthrough: Tuple[Tuple[str, Any], ...]
    meter_provider: Any = None     # OpenTelemetry's; None: the global one, once set
    tracer_provider: Any = None
    dns_refresh: float = DEFAULT_DNS_REFRESH_MS / 1000       # seconds; 0: look a name up only when a backend is lost
    dns_min_interval: float = DEFAULT_DNS_MIN_INTERVAL_MS / 1000  # seconds between two lookups on a loss
    connections_per_address: int = 1
    max_server_delay: float = DEFAULT_MAX_SERVER_DELAY  # seconds: the longest RetryInfo delay waited for
    retry_budget: Optional[RetryBudgetSettings] = None  # grpc_retry.retry_budget (None: none)


def _int_option(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"channel option {name}: must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"channel option {name}: must be at least {minimum}, got {value}")
    return value


def _float_option(name: str, value: Any, low: float, high: Optional[float], words: str) -> Optional[float]:
    """None when not given; else a number in the range (exclusive of both ends when high is given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"channel option {name}: must be a number, got {value!r}")
    if value < low or (high is not None and not low < value < high):
        raise ValueError(f"channel option {name}: must be {words}, got {value!r}")
    return float(value)


def _check_as_grpcio(name: Any, value: Any) -> None:
    """What grpcio's channel refuses at creation (its words): grpc_retry hands these options to subchannels it
    makes later, where the error would come from every call instead."""
    if not isinstance(name, (str, bytes)):
        raise TypeError(f"Expected str, not {type(name)}")
    if not isinstance(value, (int, str, bytes)) and not hasattr(value, "__int__"):
        raise TypeError(f"Expected int, bytes, or behavior, got {type(value)}")


def parse_options(options: OptionsType) -> RetryOptions:
    """Split `options` into grpc_retry's settings and the rest; raise ValueError naming a bad option."""
    ours: Dict[str, Any] = {}
    rest = []
    for item in options or ():
        try:
            name, value = item
        except (TypeError, ValueError):
            raise ValueError(f"channel options must be (name, value) pairs, got {item!r}") from None
        if name in (SERVICE_CONFIG, ENABLE_RETRIES, PER_RPC_BUFFER, LB_POLICY) or name in OURS:
            ours[name] = value  # as in grpcio, the last value given wins
        elif isinstance(name, str) and name.startswith("grpc_retry."):  # only ours: a typo, not grpcio's
            near = closest(name, OURS)
            raise ValueError(f"channel option {name}: unknown grpc_retry option"
                             + (f" (did you mean {near}?)" if near else f" (known: {', '.join(OURS)})"))
        else:
            _check_as_grpcio(name, value)
            rest.append((name, value))
            if name == DNS_MIN_INTERVAL:
                ours[name] = value
            elif isinstance(name, str) and name.startswith("grpc."):
                near = _near_grpc_name(name)
                if near is not None:  # grpcio ignores a name it does not know: the setting would be lost silently
                    warnings.warn(f"channel option {name}: not one grpc_retry reads; passed on to grpcio, which "
                                  f"ignores names it does not know (did you mean {near}?)", UserWarning,
                                  stacklevel=_application_level())

    for name in (ENABLE_RETRIES, ENABLE):
        flag = ours.get(name, 1)
        if flag not in (0, 1) or not isinstance(flag, int):
            raise ValueError(f"channel option {name}: must be 0 or 1, got {flag!r}")
    enable = ours.get(ENABLE_RETRIES, 1)
    per_rpc = _int_option(PER_RPC_BUFFER, ours.get(PER_RPC_BUFFER, DEFAULT_PER_RPC_BUFFER), 0)
    channel = _int_option(CHANNEL_BUFFER, ours.get(CHANNEL_BUFFER, DEFAULT_CHANNEL_BUFFER), 0)
    cap = _int_option(MAX_ATTEMPTS, ours.get(MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS), 1)
    quantile = _float_option(HEDGING_QUANTILE, ours.get(HEDGING_QUANTILE), 0.0, 1.0, "in (0, 1)")
    extra = _float_option(MAX_EXTRA_LOAD, ours.get(MAX_EXTRA_LOAD), 0.0, None, "at least 0")
    refresh = _int_option(DNS_REFRESH, ours.get(DNS_REFRESH, DEFAULT_DNS_REFRESH_MS), 0)
    min_interval = _int_option(DNS_MIN_INTERVAL, ours.get(DNS_MIN_INTERVAL, DEFAULT_DNS_MIN_INTERVAL_MS), 0)
    connections = _int_option(CONNECTIONS, ours.get(CONNECTIONS, 1), 1)
    server_delay = _float_option(MAX_SERVER_DELAY, ours.get(MAX_SERVER_DELAY), 0.0, None, "at least 0")
    budget = parse_retry_budget(ours.get(RETRY_BUDGET))

    text = ours.get(SERVICE_CONFIG)
    if text is not None and not isinstance(text, (str, bytes)):
        raise ValueError(f"channel option {SERVICE_CONFIG}: must be a JSON string, got {type(text).__name__}")
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    config = _parse(text, cap)
    if config.warnings:  # once per channel, at the application's line that made it
        warnings.warn(ServiceConfigWarning("service config: " + "; ".join(config.warnings)),
                      stacklevel=_application_level())

    lb = ours.get(LB_POLICY)
    if lb is not None and lb not in LB_POLICIES:
        near = closest(lb, LB_POLICIES) if isinstance(lb, str) else None
        raise ValueError(f"channel option {LB_POLICY}: must be one of {', '.join(LB_POLICIES)}, got {lb!r}"
                         + hint(near))
    # The service config's choice wins over the channel option, as in gRPC.
    lb_policy = config.lb_policy or lb or "pick_first"

    limits = message_limits(config)
    if limits is not None:
        rest.append((SERVICE_CONFIG, limits))
    meter_provider, tracer_provider = ours.get(METER_PROVIDER), ours.get(TRACER_PROVIDER)
    for name, provider, method in ((METER_PROVIDER, meter_provider, "get_meter"),
                                   (TRACER_PROVIDER, tracer_provider, "get_tracer")):
        if provider is not None and not callable(getattr(provider, method, None)):
            raise ValueError(f"channel option {name}: must be an OpenTelemetry provider (with {method}()), "
                             f"got {type(provider).__name__}")
    return RetryOptions(config, bool(enable), per_rpc, channel, cap, 0.0 if quantile is None else quantile,
                        -1.0 if extra is None else extra, lb_policy, tuple(rest), meter_provider, tracer_provider,
                        refresh / 1000, min_interval / 1000, connections,
                        DEFAULT_MAX_SERVER_DELAY if server_delay is None else server_delay, budget)


# The grpc.* names a near miss of which is warned: those grpc_retry reads, and its own (written as grpc.*).
_READ_NAMES = (SERVICE_CONFIG, ENABLE_RETRIES, PER_RPC_BUFFER, LB_POLICY, DNS_MIN_INTERVAL, INHIBIT_HEALTH) + OURS


@functools.lru_cache(maxsize=256)  # a lookup costs ~60 us, a channel ~80 us; an application has few option names
def _near_grpc_name(name: str) -> Optional[str]:
    """The name grpc_retry reads that a grpc.* option it does not read is a near miss of, or None. The cutoff
    is high: no channel argument C-core 1.85 knows is this close to one of these, so none of grpcio's is flagged."""
    return None if name in _READ_NAMES else closest(name, _READ_NAMES, cutoff=0.8)


def _parse(text: Optional[str], cap: int) -> ServiceConfig:
    if text is None:
        return parse_service_config(None, max_attempts_cap=cap)
    config = _parsed.get((text, cap))
    if config is None:  # an invalid config raises: never kept
        config = parse_service_config(text, max_attempts_cap=cap)
        if len(_parsed) >= PARSED_KEPT:
            _parsed.clear()
        _parsed[(text, cap)] = config
    return config


def message_limits(config: ServiceConfig) -> Optional[str]:
    """The service config of the subchannels: only the methods' message size limits, which grpcio's core then
    enforces per attempt as it would on a grpcio channel (same statuses, same words). None if there are none."""
    table = config.method_configs
    if not any(mc.max_request_message_bytes is not None or mc.max_response_message_bytes is not None
               for mc in table.values()):
        return None
    entries = []
    for key, mc in table.items():  # every entry, limits or not: a specific one shadows a general one
        service, _, method = key[1:].partition("/")
        name = {} if key == "" else {"service": service, **({"method": method} if method else {})}
        entry: Dict[str, Any] = {"name": [name]}
        if mc.max_request_message_bytes is not None:
            entry["maxRequestMessageBytes"] = mc.max_request_message_bytes
        if mc.max_response_message_bytes is not None:
            entry["maxResponseMessageBytes"] = mc.max_response_message_bytes
        entries.append(entry)
    return json.dumps({"methodConfig": entries})


def _application_level() -> int:
    """The stacklevel, for its caller's warnings.warn, of the first frame outside grpc_retry: the application's
    (however many of grpc_retry's frames are between, and compiled modules have none)."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("grpc_retry"):
        frame, level = frame.f_back, level + 1
    return level
