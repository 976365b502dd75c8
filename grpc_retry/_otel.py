"""OpenTelemetry as grpc_retry finds it: whether the API is installed and what GRPC_RETRY_OTEL allows, whether a
provider is a real one, how to read the current context and a span's context fast where OpenTelemetry keeps them
as it always has, and the instruments observed at collection (adaptive hedging's state, outlier ejections).
Everything here runs when a channel is made or metrics are collected, never on a call's path."""

from __future__ import annotations

import contextvars
import functools
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Tuple

from grpc_retry._version import __version__

OTEL_ENV = "GRPC_RETRY_OTEL"  # "none", "metrics", "spans", or unset / "all": what grpc_retry exports to OpenTelemetry


def otel_switch() -> Tuple[bool, bool]:
    """(metrics on, spans on) as GRPC_RETRY_OTEL allows them."""
    value = os.environ.get(OTEL_ENV, "all").strip().lower()
    parts = {p.strip() for p in value.split(",")}
    if parts & {"none", "off", "0", "false", "no"}:
        return False, False
    if parts & {"all", "", "1", "on", "true", "yes"}:
        return True, True
    return "metrics" in parts, "spans" in parts


_api: Any = False  # OpenTelemetry's metrics and trace modules; None: not installed; False: not looked for yet


def otel_api() -> Any:
    """OpenTelemetry's metrics and trace modules, or None: imported on a channel's creation, not grpc_retry's
    import, and looked for once (a failed import is not cached by Python: it searches sys.path every time)."""
    global _api
    if _api is False:
        try:
            import opentelemetry.metrics as metrics
            import opentelemetry.trace as trace
        except ImportError:
            _api = None
        else:
            _api = (metrics, trace)
    return _api


def provider_set(provider: Any) -> bool:
    """Whether `provider` is a real one (not OpenTelemetry API's no-op or not-yet-set proxy)."""
    name = type(provider).__name__
    return not (name.startswith("NoOp") or name.startswith("_Proxy") or name.startswith("Proxy"))


# Adaptive hedging's state per method (the delay before its next hedge now, its hedges not sent for budget),
# observed when a reader collects: nothing per call. A meter keeps the first instrument of a name (and only its
# callbacks), so the instruments are made once per meter provider and observe every open channel made with it.
_hedging_channels: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
_observed_lock = threading.Lock()


def _observed(registry: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]], provider: Any, item: Any,
              instruments: Callable[[Any, weakref.WeakSet[Any]], None]) -> None:
    """Add `item` to what `provider`'s meter observes in `registry`; the first time, make the `instruments` on it
    (they read the set of items as a reader collects)."""
    with _observed_lock:
        items = registry.get(provider)
        if items is None:
            items = registry[provider] = weakref.WeakSet()
            instruments(provider.get_meter("grpc_retry", __version__), items)
        items.add(item)


def _open(channels: weakref.WeakSet[Any]) -> List[Any]:
    with _observed_lock:
        return [channel for channel in channels if not channel.closed]


def observe_hedging(provider: Any, channel: Any) -> None:
    """Observe `channel` (a ChannelState: `closed`, `telemetry.target`, `hedges()`) on `provider`'s meter."""
    def instruments(meter: Any, channels: weakref.WeakSet[Any]) -> None:
        meter.create_observable_gauge(
            "grpc_retry.client.hedging_delay", callbacks=[functools.partial(_observe, channels, True)],
            unit="s", description="Adaptive hedging: the delay before a call's next hedge, now.")
        meter.create_observable_counter(
            "grpc_retry.client.hedges_not_sent_for_budget",
            callbacks=[functools.partial(_observe, channels, False)], unit="{hedge}",
            description="Hedges that were due but not sent: over grpc_retry.max_extra_load.")
    _observed(_hedging_channels, provider, channel, instruments)


def _observe(channels: weakref.WeakSet[Any], delays: bool, options: Any = None) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    now = time.monotonic()
    return [Observation(hedge.delay(now) if delays else hedge.budget_stopped,
                        {"grpc.method": method.lstrip("/"), "grpc.target": channel.telemetry.target})
            for channel in _open(channels) for method, hedge in channel.hedges()]


# Calls whose retry or hedge grpc_retry.retry_budget refused, per method, observed the same way.
_budget_channels: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
BUDGET_REFUSED = "grpc_retry.client.call.retries_refused_by_budget"


def observe_budget(provider: Any, channel: Any) -> None:
    """Observe `channel` (a ChannelState: `closed`, `telemetry.target`, `budget_refusals()`) on `provider`'s
    meter."""
    def instruments(meter: Any, channels: weakref.WeakSet[Any]) -> None:
        meter.create_observable_counter(
            BUDGET_REFUSED, callbacks=[functools.partial(_observe_budget, channels)], unit="{call}",
            description="Calls whose retry or hedge was not sent: over grpc_retry.retry_budget.")
    _observed(_budget_channels, provider, channel, instruments)


def _observe_budget(channels: weakref.WeakSet[Any], options: Any = None) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    return [Observation(refused, {"grpc.method": method.lstrip("/"), "grpc.target": channel.telemetry.target})
            for channel in _open(channels) for method, refused in channel.budget_refusals()]


# Outlier detection's counters (gRFC A91's names), observed the same way: per meter provider, every open
# channel's detector, summed per target.
_outlier_detectors: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
OUTLIER_COUNTERS = {
    "ejections_enforced_total": "Total enforced ejections due to any outlier type.",
    "ejections_overflow": "Ejections aborted because of the max ejection percentage.",
    "ejections_enforced_success_rate": "Enforced success rate outlier ejections.",
    "ejections_detected_success_rate": "Detected (even if unenforced) success rate outlier ejections.",
    "ejections_enforced_failure_percentage": "Enforced failure percentage outlier ejections.",
    "ejections_detected_failure_percentage": "Detected (even if unenforced) failure percentage outlier ejections.",
}


def observe_outliers(provider: Any, detector: Any, target: str) -> None:
    """Observe `detector` (an OutlierDetector: `closed`, `counts`) on `provider`'s meter, labelled `target`."""
    detector.metric_target = target

    def instruments(meter: Any, detectors: weakref.WeakSet[Any]) -> None:
        for name, description in OUTLIER_COUNTERS.items():
            meter.create_observable_counter(
                f"grpc.lb.outlier_detection.{name}", unit="{ejection}", description=description,
                callbacks=[functools.partial(_observe_outliers, detectors, name)])
    _observed(_outlier_detectors, provider, detector, instruments)


def _observe_outliers(detectors: weakref.WeakSet[Any], name: str, options: Any = None) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    with _observed_lock:
        detectors_now = list(detectors)
    totals: Dict[str, int] = {}
    for detector in detectors_now:  # a closed channel's ejections still count: counters never go down
        totals[detector.metric_target] = totals.get(detector.metric_target, 0) + detector.counts[name]
    return [Observation(value, {"grpc.target": target}) for target, value in totals.items()]


def span_key(trace: Any, context: Any) -> Any:
    """(Context's class, the key a span is set under) when OpenTelemetry's set_span_in_context makes a Context
    that holds the span as its one new item, as it has always done, and get_current_span reads it back from one
    made that way; None otherwise (set_span_in_context is called)."""
    try:
        span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
        empty = context.Context()
        made = trace.set_span_in_context(span, empty)
        cls = type(made)
        if not isinstance(made, dict) or len(made) != 1 or cls is not type(empty):
            return None
        ((key, value),) = made.items()
        again = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
        if value is not span or trace.get_current_span(cls({key: again})) is not again:
            return None
    except Exception:  # (a Context of its own making: set_span_in_context is called)
        return None
    return cls, key


def current_context(context: Any) -> Any:
    """What returns the current OpenTelemetry context: the get() of the context variable OpenTelemetry's default
    runtime context keeps it in, as it has always done (a C call, where get_current() is three Python calls), when
    that is the runtime context in use and reads back what is attached; else context.get_current."""
    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if type(runtime).__name__ != "ContextVarsRuntimeContext" or not isinstance(variable, contextvars.ContextVar):
        return context.get_current
    try:
        probe = context.set_value(context.create_key("grpc_retry.probe"), True)
        token = context.attach(probe)
        try:
            seen = variable.get()
        finally:
            context.detach(token)
        if seen is not probe or variable.get() is not context.get_current():
            return context.get_current
    except Exception:  # (a runtime context of its own making: get_current is called)
        return context.get_current
    return variable.get


def tuple_span_context(trace: Any) -> Any:
    """OpenTelemetry's SpanContext class when it is a tuple of (trace_id, span_id, is_remote, trace_flags,
    trace_state, is_valid), as it has always been: a span's context is then read by unpacking it, not through six
    properties. None otherwise (the properties are read)."""
    cls = trace.SpanContext
    try:
        probe = cls(0x1234, 0x5678, True, trace.TraceFlags(1))
        fields = tuple(probe) if isinstance(probe, tuple) else ()
    except Exception:  # (a layout of its own: read through the properties)
        return None
    expected = (probe.trace_id, probe.span_id, probe.is_remote, probe.trace_flags, probe.trace_state,
                probe.is_valid)
    if len(fields) != 6 or any(a is not b for a, b in zip(fields, expected, strict=True)):
        return None
    return cls
