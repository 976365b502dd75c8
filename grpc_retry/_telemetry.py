"""What the retries did, exported: the trace log, OpenTelemetry metrics (gRFC A96, A66's call duration) and a span
per logical call. The call machine notes its decisions (`machine.notes`) only for a call observed here; a call
no one observes costs one test where it starts.

Switched on by: the "grpc_retry" logger at DEBUG (GRPC_RETRY_TRACE=1 adds a stderr handler without code), an
OpenTelemetry meter or tracer provider (the global one once set, or one passed with the channel options
`grpc_retry.meter_provider` / `grpc_retry.tracer_provider`), with `opentelemetry-api` installed. Switched off for
the whole process, whatever providers are set, by GRPC_RETRY_OTEL: "none" (no metrics, no spans), "metrics" or
"spans" (only those); read when a channel is made. With spans on, each attempt carries its own span's trace
context (W3C `traceparent`, through OpenTelemetry's propagator) in its metadata.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from time import perf_counter
from typing import Any, Dict, List, Optional, Tuple

import grpc

from grpc_retry._core import (
    COMMIT_OVERFLOW,
    HEDGE,
    NOTE_BACKOFF,
    NOTE_COMMIT,
    NOTE_END,
    NOTE_HEDGE_NOW,
    NOTE_RECV_TIMEOUT,
    NOTE_SERVER_DELAY,
    NOTE_START,
    NOTE_STATUS,
    NOTE_STOP,
    NOTE_TRANSPARENT,
    ORIGINAL,
    REASONS,
    REFUSED,
    RETRY,
    TRANSPARENT,
    CallMachine,
    RetryThrottle,
    traceparent,
)
from grpc_retry._otel import (
    current_context,
    otel_api,
    otel_switch,
    provider_set,
    span_key,
    tuple_span_context,
)
from grpc_retry._version import __version__

log = logging.getLogger("grpc_retry")

TRACE_ENV = "GRPC_RETRY_TRACE"


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_WHY = {RETRY: "retry", HEDGE: "hedge", TRANSPARENT: "transparent retry"}
_TYPES = {ORIGINAL: "original", RETRY: "retry", HEDGE: "hedge", TRANSPARENT: "transparent_retry"}
_STOPS = {"throttled": "throttled", "pushback_stop": "pushback", "hedge_budget": "hedge budget spent",
          "retry_budget": "budget"}

# A66's bucket boundaries for latencies (seconds); for counts, C-core's for its retry histograms.
LATENCY_BUCKETS = (0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006,
                   0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16, 0.2,
                   0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100)
COUNT_BUCKETS = (1, 2, 3, 4, 5)

_ATTEMPT_NAMES = tuple(f"attempt {n}" for n in range(1, 9))  # attempt spans' names
_NAMES = tuple(_CODE_NAMES.get(code) or str(code) for code in range(17))  # status code -> its name
# The first attempt's span events, the same for every call: "attempt ended" by status code, "committed" by cause
_FIRST_ENDED = tuple({"attempt": 1, "grpc.status": name} for name in _NAMES)
_FIRST_COMMITTED = ({"attempt": 1, "cause": "answered"}, {"attempt": 1, "cause": "replay buffer full"})
_call_ids = itertools.count(1)  # next() is atomic under the GIL: ids unique within the process
# Span events' attributes, made once for each set of values (most calls' are alike) and shared, never changed
# (OpenTelemetry's SDK copies what it is given): (event, attempt, value) -> attributes. (Attempt spans' are the
# channel's: Telemetry._attempts.)
_EVENT_ATTRIBUTES: Dict[Tuple[str, int, Any], Dict[str, Any]] = {}
# A method's span name, span attributes, metric labels, and its duration's labels per status code
_MethodLabels = Tuple[str, Dict[str, str], Dict[str, str], Dict[int, Dict[str, str]]]


_LOG_CACHE: Dict[int, bool] = getattr(log, "_cache", {})  # logging's answers by level, cleared as levels change
_DEBUG = logging.DEBUG


def _debug_logged() -> bool:
    """log.isEnabledFor(DEBUG), without its Python call once logging has cached the answer (every call asks)."""
    cached = _LOG_CACHE.get(_DEBUG)
    if cached is None or log.disabled:
        return log.isEnabledFor(_DEBUG)
    return cached


def trace_from_environment() -> None:
    """GRPC_RETRY_TRACE=1: the trace log on stderr, with no code."""
    if os.environ.get(TRACE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        if not any(getattr(h, "_grpc_retry_trace", False) for h in log.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s grpc_retry %(message)s"))
            handler._grpc_retry_trace = True  # type: ignore[attr-defined]
            log.addHandler(handler)
        log.setLevel(logging.DEBUG)


def canonical_target(target: str) -> str:
    """A66's grpc.target: the target as a URI (a bare host:port is a dns:/// one)."""
    scheme = target.split(":", 1)[0]
    if ":" in target and scheme in ("dns", "ipv4", "ipv6", "unix", "unix-abstract"):
        return target
    return "dns:///" + target


class _Metrics:
    """The A96 / A66 histograms, made once per channel."""

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter("grpc_retry", __version__)

        def histogram(name: str, unit: str, description: str, buckets: Tuple[float, ...]) -> Any:
            try:
                return meter.create_histogram(name, unit=unit, description=description,
                                              explicit_bucket_boundaries_advisory=list(buckets))
            except TypeError:  # opentelemetry-api before 1.23: no advisory; the SDK's view decides the buckets
                return meter.create_histogram(name, unit=unit, description=description)

        self.retries = histogram("grpc.client.call.retries", "{retry}",
                                 "Retry attempts made during the client call (not the original attempt).",
                                 COUNT_BUCKETS)
        self.transparent = histogram("grpc.client.call.transparent_retries", "{transparent_retry}",
                                     "Transparent retries made during the client call.", COUNT_BUCKETS)
        self.hedges = histogram("grpc.client.call.hedges", "{hedge}",
                                "Hedged attempts made during the client call (not the original attempt).",
                                COUNT_BUCKETS)
        self.retry_delay = histogram("grpc.client.call.retry_delay", "s",
                                     "Total time with no attempt in flight during the client call.",
                                     LATENCY_BUCKETS)
        self.duration = histogram("grpc.client.call.duration", "s",
                                  "Time from the start to the end of the client call, as the application sees it.",
                                  LATENCY_BUCKETS)
        self.recv_timeouts = meter.create_counter(
            "grpc_retry.client.attempt.recv_timeouts", unit="{attempt}",
            description="Attempts cancelled because they did not answer within perAttemptRecvTimeout.")
        self.server_delays = meter.create_counter(
            "grpc_retry.client.call.server_delays", unit="{delay}",
            description="Retries delayed as a server's google.rpc.RetryInfo asked.")
        # What every call records, bound once (a call is then one C call, not a lookup of `record` by name)
        self.record_delay = self.retry_delay.record
        self.record_duration = self.duration.record


class Telemetry:
    """A channel's exporters: what is on is decided when the channel is made (the log level, per call)."""

    __slots__ = ("target", "throttle", "metrics", "meter_provider", "tracer", "_trace_api", "_propagate",
                 "_baggage", "_context_api", "_current", "_client", "_textmap", "_span_context", "_span_key",
                 "_no_state", "_textmap_global", "_methods", "_ends", "_attempts", "_firsts", "_hosts")

    def __init__(self, target: str, throttle: Optional[RetryThrottle], meter_provider: Any = None,
                 tracer_provider: Any = None) -> None:
        self.target = canonical_target(target)
        self.throttle = throttle
        self.metrics: Optional[_Metrics] = None
        self.meter_provider: Any = None  # set when metrics are on
        self.tracer: Any = None
        self._trace_api: Any = None
        self._propagate: Any = None
        self._baggage: Any = None
        self._context_api: Any = None
        self._current: Any = None  # () -> the caller's OpenTelemetry context (context.get_current, or what it reads)
        self._client: Any = None  # SpanKind.CLIENT (an enum member: read once)
        self._textmap: Tuple[Any, bool] = (None, False)  # the propagator last seen, and whether it is the default
        self._textmap_global = False  # whether that propagator is read from the module global it is kept in
        self._span_context: Any = None  # OpenTelemetry's SpanContext, when its fields are a tuple's, in order
        self._span_key: Any = None  # (Context's class, the key of its span) when a span is set in it as a dict item
        self._no_state: Any = None  # the empty TraceState a span's context has unless it was given one
        # method -> its span name, span attributes, metric labels and (per status code, filled as they come) the
        # duration's labels, made once (each call would make them anew)
        self._methods: Dict[str, _MethodLabels] = {}
        # (attempts, retries, hedges, transparent retries, reason, code), packed in one int -> a call span's
        # attributes at its end
        self._ends: Dict[int, Dict[str, Any]] = {}
        # (attempt, its type, previous attempts, backend) -> an attempt span's attributes (shared, as _ends')
        self._attempts: Dict[Tuple[int, int, int, str], Dict[str, Any]] = {}
        self._firsts: Dict[str, Dict[str, Any]] = {}  # a subchannel's address -> its first attempts' (the same)
        self._hosts: Dict[str, str] = {}  # a subchannel's address ("ipv4:host:port") -> its host:port
        api = otel_api()
        if api is None:
            return
        metrics, trace = api
        metrics_on, spans_on = otel_switch()
        if meter_provider is None:
            meter_provider = metrics.get_meter_provider()
        if metrics_on and provider_set(meter_provider):
            self.metrics = _Metrics(meter_provider)
            self.meter_provider = meter_provider
        if tracer_provider is None:
            tracer_provider = trace.get_tracer_provider()
        if spans_on and provider_set(tracer_provider):
            self.tracer = tracer_provider.get_tracer("grpc_retry", __version__)
            from opentelemetry import baggage, context, propagate

            self._trace_api, self._propagate, self._baggage, self._context_api = trace, propagate, baggage, context
            self._current = current_context(context)
            self._client = trace.SpanKind.CLIENT
            self._span_context = tuple_span_context(trace)
            self._span_key = span_key(trace, context)
            self._no_state = getattr(trace, "DEFAULT_TRACE_STATE", None)
            # get_global_textmap() returns the module's _HTTP_TEXT_FORMAT, as it has always done: read it there
            # (a lookup, where the call is a Python call each time)
            self._textmap_global = getattr(propagate, "_HTTP_TEXT_FORMAT", None) is propagate.get_global_textmap()

    def with_span(self, span: Any, context: Any) -> Any:
        """trace.set_span_in_context(span, context), without its two Python calls where its Context is known."""
        known = self._span_key
        if known is None:
            return self._trace_api.set_span_in_context(span, context)
        cls, key = known
        values = dict(context) if context else {}  # (most callers' context is empty)
        values[key] = span
        return cls(values)

    def _w3c_only(self) -> bool:
        """Whether the process's propagator is OpenTelemetry's default (W3C trace context, then W3C baggage): with
        no baggage, the trace context is then all it would write."""
        propagate = self._propagate
        textmap = propagate._HTTP_TEXT_FORMAT if self._textmap_global else propagate.get_global_textmap()
        seen, default = self._textmap
        if textmap is not seen:
            from opentelemetry.baggage.propagation import W3CBaggagePropagator
            from opentelemetry.propagators.composite import CompositePropagator
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            parts = getattr(textmap, "_propagators", None) if type(textmap) is CompositePropagator else None
            default = parts is not None and [type(part) for part in parts] == [
                TraceContextTextMapPropagator, W3CBaggagePropagator]
            self._textmap = (textmap, default)  # one assignment: calls on other threads see both or neither
        return default

    def method(self, method: str) -> _MethodLabels:
        """A method's span name, span attributes, metric labels and duration labels per status code (not to be
        changed: shared by its calls)."""
        known = self._methods.get(method)
        if known is None:
            name = method.lstrip("/")
            service, _, short = name.partition("/")
            known = (name, {"rpc.system": "grpc", "rpc.service": service, "rpc.method": short,
                            "grpc.target": self.target}, {"grpc.method": name, "grpc.target": self.target}, {})
            if len(self._methods) < 1024:  # (a generic client may name methods without end)
                self._methods[method] = known
        return known

    def observe(self, method: str, machine: CallMachine, addresses: List[str]) -> Optional[CallTelemetry]:
        """The telemetry of a call starting now, or None when nothing would be exported. Whether the call is
        traced in the log is decided now, for the whole call."""
        tracing = _debug_logged()
        if self.metrics is None and self.tracer is None and not tracing:
            return None
        machine.notes = []
        call = CallTelemetry.__new__(CallTelemetry)  # (compiled: no arguments parsed)
        call._begin(self, method, machine, addresses, tracing)
        return call


def _is_decision(kind: int) -> bool:
    """Whether a note of this kind is a decision (one that follows an attempt's status goes on its line)."""
    return (kind == NOTE_BACKOFF or kind == NOTE_HEDGE_NOW or kind == NOTE_TRANSPARENT or kind == NOTE_STOP
            or kind == NOTE_SERVER_DELAY)


def _code_name(code: int) -> str:
    """A status code's name (its number, for one beyond gRPC's)."""
    if 0 <= code < len(_NAMES):
        return _NAMES[code]
    return _CODE_NAMES.get(code) or str(code)


def _attributes(event: str, n: int, name: str, value: Any) -> Dict[str, Any]:
    """A span event's attributes, {"attempt": n + 1, name: value}, shared by the events alike (_EVENT_ATTRIBUTES)."""
    key = (event, n, value)
    attributes = _EVENT_ATTRIBUTES.get(key)
    if attributes is None:
        attributes = {"attempt": n + 1, name: value}
        if len(_EVENT_ATTRIBUTES) < 1024:
            _EVENT_ATTRIBUTES[key] = attributes
    return attributes


class CallTelemetry:
    """One logical call's trace lines, span and metrics, from its machine's notes. Most calls are one attempt
    that answers: its span and status are kept in fields of their own (no dict made or freed for them)."""

    __slots__ = ("_channel", "_method", "_labels", "_machine", "_addresses", "_tracing", "_id", "_started", "_span",
                 "_context", "_parent", "_baggage", "_span0", "_code0", "_attempt_spans", "_where", "_codes",
                 "_ended")

    def __init__(self, channel: Telemetry, method: str, machine: CallMachine, addresses: List[str],
                 tracing: bool) -> None:
        self._begin(channel, method, machine, addresses, tracing)

    def _begin(self, channel: Telemetry, method: str, machine: CallMachine, addresses: List[str],
               tracing: bool) -> None:
        """What __init__ does, as a C call (Telemetry.observe makes the object without parsing arguments)."""
        self._channel = channel
        self._method = method
        self._labels = self._channel.method(method)  # (self._channel: a C call when compiled, channel a lookup)
        self._machine = machine
        self._addresses = addresses   # the subchannels' list: index -> "host:port", grows, never reorders
        self._tracing = tracing
        self._id = next(_call_ids) if tracing else 0  # (only the log names calls)
        self._started = perf_counter()
        self._where: Optional[Dict[int, str]] = {} if tracing else None  # attempt -> its backend, for the log
        self._code0 = -1   # attempt 0's status code (-1: not yet)
        self._codes: Optional[Dict[int, int]] = None   # later attempts' -> their status codes
        self._ended = False
        self._span: Any = None
        self._context: Any = None  # the caller's OpenTelemetry context: every attempt's, on whatever thread
        self._parent: Any = None   # it with the call's span: the attempts' spans' parent
        self._baggage = False      # whether the caller's context has baggage
        self._span0: Any = None    # attempt 0's span, until it ends
        self._attempt_spans: Optional[Dict[int, Any]] = None  # later attempts' spans, until they end
        if channel.tracer is not None:
            self._start_call()

    def _start_call(self) -> None:
        """The call's span, a child of the caller's context."""
        api = self._channel
        name, attributes, _, _ = self._labels
        self._context = caller = api._current()
        self._span = span = api.tracer.start_span(name, context=caller, kind=api._client, attributes=attributes)
        self._parent = api.with_span(span, caller)
        self._baggage = bool(caller) and bool(api._baggage.get_all(caller))  # (an empty context has none)

    def attempt_span(self, n: int) -> Any:
        """Attempt n's span while it is open, else None."""
        if n == 0:
            return self._span0
        return None if self._attempt_spans is None else self._attempt_spans.get(n)

    def wire_context(self, n: int) -> Tuple[Tuple[str, str], ...]:
        """Attempt n's span as the trace context that goes on the wire (traceparent, tracestate), or ()."""
        span = self._span0 if n == 0 else self.attempt_span(n)
        if span is None:
            return ()
        api = self._channel
        if not self._baggage and api._w3c_only():  # what the default propagator writes, without its contexts
            context = span.get_span_context()
            if type(context) is api._span_context:
                trace_id, span_id, _, flags, state, valid = context
            else:
                trace_id, span_id, flags, state, valid = (context.trace_id, context.span_id, context.trace_flags,
                                                          context.trace_state, context.is_valid)
            if not valid:
                return ()
            wire: Tuple[Tuple[str, str], ...] = (("traceparent", traceparent(trace_id, span_id, flags)),)
            if state is not api._no_state and state:  # (an empty TraceState's truth is a Python call)
                wire += (("tracestate", state.to_header()),)
            return wire
        carrier: Dict[str, str] = {}
        api._propagate.inject(carrier, context=api.with_span(span, self._context))
        return tuple(carrier.items())

    # -- notes ---------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Export the notes the machine has taken since the last flush."""
        notes = self._machine.take_notes()
        if notes is None:
            return
        tracing = self._tracing
        count = len(notes)
        i = 0
        while i < count:
            note = notes[i]
            kind = note[0]  # (a C int, compared with the kinds as C ints: _telemetry.pxd)
            if kind == NOTE_STATUS or kind == NOTE_RECV_TIMEOUT:
                # An attempt's end and the decision it led to: one line.
                decision = notes[i + 1] if i + 1 < count and _is_decision(notes[i + 1][0]) else None
                self._status(note, decision, tracing)
                i += 2 if decision is not None else 1
                continue
            if kind == NOTE_START:
                self._start(note, tracing)
            elif kind == NOTE_COMMIT:
                self._commit(note, tracing)
            elif kind == NOTE_END:
                self._end(note, tracing)
            else:
                self._decision(note, tracing)
            i += 1

    def _prefix(self, n: int) -> str:
        where = self._where
        return f"call {self._id} {self._method} attempt {n + 1} on {'?' if where is None else where.get(n, '?')}"

    def _start(self, note: Tuple[Any, ...], tracing: bool) -> None:
        _, n, address, previous, why, after = note
        api = self._channel
        backend = self._addresses[address] if 0 <= address < len(self._addresses) else "?"
        first = n == 0 and why == ORIGINAL and previous == 0
        if first and self._span is not None and not tracing:
            # The usual call's first attempt: its span's attributes are its backend's alone, kept by its address
            attributes = api._firsts.get(backend)
            if attributes is not None:
                self._span0 = api.tracer.start_span(_ATTEMPT_NAMES[0], context=self._parent, kind=api._client,
                                                    attributes=attributes)
                return
        where = api._hosts.get(backend)  # (the same str each time: its hash kept)
        if where is None:
            where = backend[5:] if backend.startswith(("ipv4:", "ipv6:")) else backend
            if len(api._hosts) < 4096:
                api._hosts[backend] = where
        if self._where is not None:
            self._where[n] = where
        if self._span is not None:  # each attempt's span, a child of the call's
            key = (n, why, previous, where)
            attributes = api._attempts.get(key)
            if attributes is None:
                attributes = {"grpc_retry.attempt": n + 1, "grpc_retry.attempt_type": _TYPES[why],
                              "grpc_retry.previous_attempts": previous, "server.address": where}
                if len(api._attempts) < 1024:
                    api._attempts[key] = attributes
            if first and len(api._firsts) < 1024:
                api._firsts[backend] = attributes
            span = api.tracer.start_span(_ATTEMPT_NAMES[n] if n < len(_ATTEMPT_NAMES) else f"attempt {n + 1}",
                                         context=self._parent, kind=api._client, attributes=attributes)
            if n == 0:
                self._span0 = span
            else:
                if self._attempt_spans is None:
                    self._attempt_spans = {}
                self._attempt_spans[n] = span
        if why != ORIGINAL:  # (a retry, hedge or transparent retry)
            text = f"{_WHY[why]} {n + 1} on {where}" + (f" after {after * 1000:.0f} ms" if why == HEDGE else "")
            if tracing:
                log.debug("call %d %s → %s", self._id, self._method, text)
            self._event(_WHY[why], {"attempt": n + 1, "backend": where, "previous_attempts": previous})
        elif tracing:
            log.debug("call %d %s attempt 1 on %s", self._id, self._method, where)

    def _status(self, note: Tuple[Any, ...], decision: Optional[Tuple[Any, ...]], tracing: bool) -> None:
        timed_out = note[0] == NOTE_RECV_TIMEOUT  # cancelled: no answer within perAttemptRecvTimeout
        n = note[1]
        code = 1 if timed_out else note[2]
        if n == 0:
            self._code0 = code
        else:
            if self._codes is None:
                self._codes = {}
            self._codes[n] = code
        name = _code_name(code)
        self._end_attempt_span(n, name, code)
        if self._span is not None:
            if timed_out:
                self._span.add_event("attempt timed out", {"attempt": n + 1})
            else:
                self._span.add_event("attempt ended", _FIRST_ENDED[code] if n == 0 and 0 <= code < len(_FIRST_ENDED)
                                     else _attributes("attempt ended", n, "grpc.status", name))
        what = self._decision(decision, False) if decision is not None else None
        if tracing:
            if timed_out:
                name = "no answer within perAttemptRecvTimeout, cancelled"
            log.debug("%s: %s%s", self._prefix(n), name, f" → {what}" if what else "")

    def _decision(self, note: Optional[Tuple[Any, ...]], tracing: bool) -> Optional[str]:
        """The words of a decision (and its span event); logged here when it came with no attempt's status."""
        if note is None:
            return None
        kind = note[0]
        if kind == NOTE_BACKOFF:
            _, _, delay, number, limit = note
            text = f"retry in {delay * 1000:.0f} ms ({number} of {limit})"
            self._event("retry scheduled", {"delay_ms": round(delay * 1000, 3), "attempt": number})
        elif kind == NOTE_HEDGE_NOW:
            text = "next hedge now"
            self._event("hedge brought forward", {})
        elif kind == NOTE_TRANSPARENT:
            text = "transparent retry (" + ("refused by the server" if note[2] == REFUSED else "never sent") + ")"
            self._event("transparent retry", {"attempt": note[1] + 1})
        elif kind == NOTE_STOP:
            _, reason, value = note
            name = REASONS[reason]
            text = (("hedge" if self._machine.hedging else "retry") + " not sent: budget" if name == "retry_budget"
                    else "stop: " + _STOPS.get(name, name))
            throttle = self._channel.throttle
            if name == "throttled" and throttle is not None:
                text += f" (tokens {value:.1f} ≤ {throttle.max_milli_tokens / 2000:g})"
            self._event(_STOPS.get(name, name), {} if value < 0 else {"tokens": value})
        elif kind == NOTE_SERVER_DELAY:
            _, _, delay, honoured = note
            text = f"server asks to wait {delay * 1000:.0f} ms (RetryInfo)" + (
                "" if honoured else ": past the deadline or grpc_retry.max_server_delay, no retry")
            self._event("server delay", {"delay_ms": round(delay * 1000, 3), "honoured": honoured})
            metrics = self._channel.metrics
            if honoured and metrics is not None:
                metrics.server_delays.add(1, self._labels[2])
        else:
            return None
        if tracing:
            log.debug("call %d %s → %s", self._id, self._method, text)
        return text

    def _commit(self, note: Tuple[Any, ...], tracing: bool) -> None:
        _, n, cause = note
        why = "replay buffer full" if cause == COMMIT_OVERFLOW else "answered"
        if tracing:
            log.debug("%s: committed (%s)", self._prefix(n), why)
        if self._span is not None:
            self._span.add_event("committed", _FIRST_COMMITTED[1 if cause == COMMIT_OVERFLOW else 0] if n == 0
                                 else _attributes("committed", n, "cause", why))

    def _end(self, note: Tuple[Any, ...], tracing: bool) -> None:
        if self._ended:
            return
        self._ended = True
        _, reason, code, n = note
        machine = self._machine
        if code < 0:  # delivered: attempt n's status
            if n == 0:
                code = self._code0 if self._code0 >= 0 else 0
            else:
                code = 0 if self._codes is None else self._codes.get(n, 0)
        name = _code_name(code)
        duration = perf_counter() - self._started
        retries, hedges = machine.retries, machine.hedges
        transparent = machine.transparent_retries
        if tracing:
            log.debug("call %d %s ended %s: %s after %d attempt%s (%.1f ms)", self._id, self._method, name,
                      REASONS[reason], machine.attempts, "" if machine.attempts == 1 else "s", duration * 1000)
        metrics = self._channel.metrics
        if metrics is not None:
            _, _, labels, by_code = self._labels
            if retries:
                metrics.retries.record(retries, labels)
            if hedges:
                metrics.hedges.record(hedges, labels)
            if transparent:
                metrics.transparent.record(transparent, labels)
            metrics.record_delay(machine.idle_time, labels)
            if machine.recv_timeouts:
                metrics.recv_timeouts.add(machine.recv_timeouts, labels)
            with_status = by_code.get(code)
            if with_status is None:
                with_status = {**labels, "grpc.status": name}
                if len(by_code) < 32:  # (codes beyond gRPC's are names of their own)
                    by_code[code] = with_status
            metrics.record_duration(duration, with_status)
        span = self._span
        if span is not None:
            # Most calls end alike (one attempt, OK): their attributes are made once and shared (never changed),
            # found by the counts, reason and code packed into one int (a tuple's hash and compare cost more)
            attempts = machine.attempts
            key = -1
            if attempts < 64 and retries < 64 and hedges < 64 and transparent < 64 and 0 <= reason < 32 \
                    and 0 <= code < 1024:
                key = ((((attempts * 64 + retries) * 64 + hedges) * 64 + transparent) * 32 + reason) * 1024 + code
            ends = self._channel._ends
            attributes = ends.get(key) if key >= 0 else None
            if attributes is None:
                attributes = {"grpc_retry.attempts": attempts, "grpc_retry.retries": retries,
                              "grpc_retry.hedges": hedges, "grpc_retry.transparent_retries": transparent,
                              "grpc_retry.reason": REASONS[reason], "rpc.grpc.status_code": code}
                if key >= 0 and len(ends) < 64:
                    ends[key] = attributes
            span.set_attributes(attributes)
            # attempts the call cancelled (losing hedges, at its end)
            if self._span0 is not None:
                self._end_attempt_span(0, "CANCELLED", 1)
            if self._attempt_spans:
                for n in list(self._attempt_spans):
                    self._end_attempt_span(n, "CANCELLED", 1)
            if code != 0:
                span.set_status(self._channel._trace_api.Status(self._channel._trace_api.StatusCode.ERROR, name))
            span.end()

    def _end_attempt_span(self, n: int, name: str, code: int) -> None:
        if n == 0:
            span, self._span0 = self._span0, None
        else:
            span = None if self._attempt_spans is None else self._attempt_spans.pop(n, None)
        if span is not None:
            span.set_attribute("rpc.grpc.status_code", code)
            if code != 0:
                span.set_status(self._channel._trace_api.Status(self._channel._trace_api.StatusCode.ERROR, name))
            span.end()

    def _event(self, name: str, attributes: Dict[str, Any]) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes)
