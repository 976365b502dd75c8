"""`grpc_retry.retry_budget`: the channel option's settings, read from its JSON, and the budget that the process's
channels to one target with the same settings share (the core's RetryBudget, as `retryThrottling`'s throttle is
shared).

Rate form (GEP-3388's names and defaults): `{"budget": {"percent": 20, "interval": "10s"}, "minRetryRate":
{"count": 10, "interval": "1s"}}`. Concurrency form (Envoy's): `{"budgetPercent": 20, "minRetryConcurrency": 3}`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Dict, Optional, Tuple

from grpc_retry._core import RetryBudget
from grpc_retry._json import JsonReader, decode, listing

OPTION = "grpc_retry.retry_budget"
RATE_KEYS = ("budget", "minRetryRate")
CONCURRENCY_KEYS = ("budgetPercent", "minRetryConcurrency")
_MIN_INTERVAL, _MAX_INTERVAL = 1.0, 3600.0
UNBOUNDED = 1 << 30  # a floor no call count reaches: only max_in_flight bounds the retries


@dataclass(frozen=True)
class RetryBudgetSettings:
    """A retry budget's settings: the concurrency form (`concurrent`), or the rate form with its intervals."""

    concurrent: bool
    percent: float = 20.0
    min_count: int = 10       # minRetryRate.count, or minRetryConcurrency
    interval: float = 10.0    # budget.interval (rate form), seconds
    min_interval: float = 1.0  # minRetryRate.interval (rate form), seconds
    max_in_flight: int = -1    # (concurrency form) a cap besides: an xDS cluster's explicit max_retries (-1: none)

    def describe(self) -> str:
        if self.concurrent:
            if self.min_count >= UNBOUNDED:
                return f"retries in flight at most {self.max_in_flight}"
            return (f"retries in flight at most {self.percent:g}% of the calls in flight, and at least "
                    f"{self.min_count}" + (f", but never more than {self.max_in_flight}"
                                           if self.max_in_flight >= 0 else ""))
        return (f"retries at most {self.percent:g}% of the calls over {self.interval:g}s, and at least "
                f"{self.min_count} per {self.min_interval:g}s")


def parse_retry_budget(value: Any) -> Optional[RetryBudgetSettings]:
    """The option's settings (None: not given). Raises ValueError naming each bad field by its path."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        try:
            value = decode(value)
        except (ValueError, TypeError, RecursionError) as error:
            raise ValueError(f"channel option {OPTION}: not JSON ({error})") from None
    elif isinstance(value, dict):
        value = decode(json.dumps(value))
    else:
        raise ValueError(f"channel option {OPTION}: must be a JSON object (a string), got {type(value).__name__}")
    reader = JsonReader()
    settings = _read(reader, value)
    reader.duplicates(value)
    if reader.errors:
        raise ValueError(f"channel option {OPTION}: {listing(reader.errors)}")
    assert settings is not None
    return settings


def _read(reader: JsonReader, doc: Any) -> Optional[RetryBudgetSettings]:
    obj = reader.json_object(doc, "<root>")
    if obj is None:
        return None
    _unknown(reader, obj, "", RATE_KEYS + CONCURRENCY_KEYS)
    rate = [key for key in RATE_KEYS if key in obj]
    concurrency = [key for key in CONCURRENCY_KEYS if key in obj]
    if rate and concurrency:
        reader.error(concurrency[0], f"the concurrency form cannot be given with the rate form's {rate[0]!r}: "
                                     "one form or the other")
        return None
    if concurrency:
        percent = _percent(reader, reader.get(obj, "", "budgetPercent", reader.number))
        floor = reader.check(reader.get(obj, "", "minRetryConcurrency", reader.integer), "minRetryConcurrency",
                             lambda n: n >= 0, "must be at least 0")
        return RetryBudgetSettings(True, 20.0 if percent is None else percent, 3 if floor is None else floor)
    settings = RetryBudgetSettings(False)
    budget = reader.get(obj, "", "budget", reader.json_object)
    if budget is not None:
        _unknown(reader, budget, "budget", ("percent", "interval"))
        percent = _percent(reader, reader.get(budget, "budget", "percent", reader.number), "budget.percent")
        interval = _interval(reader, reader.get(budget, "budget", "interval", reader.duration), "budget.interval")
        settings = RetryBudgetSettings(False, settings.percent if percent is None else percent, settings.min_count,
                                       settings.interval if interval is None else interval)
    min_rate = reader.get(obj, "", "minRetryRate", reader.json_object)
    if min_rate is not None:
        _unknown(reader, min_rate, "minRetryRate", ("count", "interval"))
        count = reader.check(reader.get(min_rate, "minRetryRate", "count", reader.integer), "minRetryRate.count",
                             lambda n: n >= 0, "must be at least 0")
        interval = _interval(reader, reader.get(min_rate, "minRetryRate", "interval", reader.duration),
                             "minRetryRate.interval")
        settings = RetryBudgetSettings(False, settings.percent, settings.min_count if count is None else count,
                                       settings.interval, settings.min_interval if interval is None else interval)
    return settings


def _unknown(reader: JsonReader, obj: Dict[str, Any], path: str, known: Tuple[str, ...]) -> None:
    """grpc_retry's own option: a key it does not know is an error, not a warning (a typo would lose a setting)."""
    reader.unknown_keys(obj, path or "<root>", known)
    reader.errors.extend(reader.warnings)
    reader.warnings.clear()


def _percent(reader: JsonReader, value: Optional[Decimal], path: str = "budgetPercent") -> Optional[float]:
    checked = reader.check(value, path, lambda v: 0 <= v <= 100, "must be from 0 to 100")
    return None if checked is None else float(checked)


def _interval(reader: JsonReader, value: Optional[float], path: str) -> Optional[float]:
    return reader.check(value, path, lambda v: _MIN_INTERVAL <= v <= _MAX_INTERVAL, "must be from 1s to 1h")


# Budgets by target and settings: every channel of the process to a target with the same settings shares one.
_budgets: Dict[Tuple[str, RetryBudgetSettings], RetryBudget] = {}
_budgets_lock = threading.Lock()


def budget_for(target: str, settings: Optional[RetryBudgetSettings]) -> Optional[RetryBudget]:
    if settings is None:
        return None
    key = (target, settings)
    with _budgets_lock:
        budget = _budgets.get(key)
        if budget is None:
            budget = _budgets[key] = new_budget(settings)
        return budget


def new_budget(settings: RetryBudgetSettings) -> RetryBudget:
    return RetryBudget(settings.concurrent, settings.percent, settings.min_count, settings.interval,
                       settings.min_interval, settings.max_in_flight)
