"""The trace context each attempt carries: exactly what the process's OpenTelemetry propagator writes for the
attempt's span (grpc_retry writes the default propagator's W3C headers itself, without its contexts)."""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from test_machine import machine

from grpc_retry._core import traceparent
from grpc_retry._telemetry import CallTelemetry, Telemetry


def started_call(tracer_provider: Any, telemetry: Optional[Telemetry] = None) -> CallTelemetry:
    """A call whose first attempt has started, telemetry on (spans): of a new channel, or of `telemetry`'s."""
    if telemetry is None:
        telemetry = Telemetry("127.0.0.1:1", None, None, tracer_provider)
    m = machine()
    call = telemetry.observe("/echo.Echo/Unary", m, ["ipv4:127.0.0.1:1"])
    assert call is not None
    m.start(0.0, b"x")
    call.flush()
    return call


def propagated(call: CallTelemetry, n: int = 0) -> Dict[str, str]:
    """What the global propagator itself writes for attempt n's span."""
    carrier: Dict[str, str] = {}
    span = call.attempt_span(n)
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


class TraceStated(trace.NonRecordingSpan):
    """A span whose context carries a tracestate (as one continued from a caller's would)."""

    def is_recording(self) -> bool:
        return True


class TraceStateTracer(trace.NoOpTracer):
    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return TraceStated(trace.SpanContext(0x1234, 0x5678, False, trace.TraceFlags(1),
                                             TraceState([("vendor", "value"), ("other", "x")])))


class TraceStateTracers(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return TraceStateTracer()


class Custom(TextMapPropagator):
    """A propagator of the application's own (B3-like)."""

    def inject(self, carrier: Any, context: Optional[context.Context] = None, setter: Any = None) -> None:
        span_context = trace.get_current_span(context).get_span_context()
        carrier["x-trace"] = f"{span_context.trace_id:x}:{span_context.span_id:x}"

    def extract(self, carrier: Any, context: Optional[context.Context] = None, getter: Any = None) -> Any:
        return context

    @property
    def fields(self) -> set[str]:
        return {"x-trace"}


@pytest.fixture
def global_textmap() -> Iterator[None]:
    before = propagate.get_global_textmap()
    yield
    propagate.set_global_textmap(before)


def test_the_default_propagator_s_headers_for_each_attempt() -> None:
    call = started_call(TracerProvider())
    wire = call.wire_context(0)
    assert dict(wire) == propagated(call) and [key for key, _ in wire] == ["traceparent"]
    span_context = call.attempt_span(0).get_span_context()
    assert wire[0][1] == f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"
    assert call.wire_context(1) == ()  # no such attempt


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 511))
def test_the_traceparent_is_the_propagator_s_for_any_ids_and_flags(trace_id: int, span_id: int, flags: int) -> None:
    span = trace.NonRecordingSpan(trace.SpanContext(trace_id, span_id, False, trace.TraceFlags(flags)))
    carrier: Dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    assert traceparent(trace_id, span_id, trace.TraceFlags(flags)) == carrier["traceparent"]


@pytest.mark.parametrize("ids", [(2**128, 1), (1, 2**64), (-1, 1), (1, -1)])
def test_ids_beyond_their_bytes_are_refused(ids: tuple[int, int]) -> None:
    with pytest.raises(OverflowError):
        traceparent(*ids, 1)


def test_a_tracestate_goes_with_it() -> None:
    call = started_call(TraceStateTracers())
    wire = call.wire_context(0)
    assert dict(wire) == propagated(call) == {"traceparent": "00-" + "0" * 28 + "1234-" + "0" * 12 + "5678-01",
                                              "tracestate": "vendor=value,other=x"}


class OwnSpanContext(trace.SpanContext):
    """A span context of a class of its own (read through its properties, not unpacked)."""


class OwnContextTracers(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        tracer = trace.NoOpTracer()
        tracer.start_span = lambda *args, **kwargs: TraceStated(  # type: ignore[method-assign]
            OwnSpanContext(0xABC, 0xDEF, False, trace.TraceFlags(0)))
        return tracer


def test_a_span_context_of_its_own_class_is_read_through_its_properties() -> None:
    call = started_call(OwnContextTracers())
    assert dict(call.wire_context(0)) == propagated(call) == {"traceparent": "00-" + "0" * 29 + "abc-" + "0" * 13
                                                              + "def-00"}


def test_baggage_in_the_caller_s_context_goes_too() -> None:
    token = context.attach(baggage.set_baggage("tenant", "a b"))
    try:
        call = started_call(TracerProvider())
        wire = dict(call.wire_context(0))
        assert wire == propagated(call) and wire["baggage"] == "tenant=a+b"
    finally:
        context.detach(token)


def test_a_later_attempt_carries_the_caller_s_baggage_on_any_thread() -> None:
    """The caller's context is the call's: a retry started after the caller's context is gone (on a timer's or a
    worker's thread) still carries its baggage."""
    token = context.attach(baggage.set_baggage("tenant", "a"))
    try:
        call = started_call(TracerProvider())
    finally:
        context.detach(token)
    wire: Dict[str, str] = {}
    thread = threading.Thread(target=lambda: wire.update(call.wire_context(0)))
    thread.start()
    thread.join()
    assert wire["baggage"] == "tenant=a" and "traceparent" in wire


def test_an_application_s_propagator_is_the_one_used(global_textmap: None) -> None:
    propagate.set_global_textmap(Custom())
    call = started_call(TracerProvider())
    wire = dict(call.wire_context(0))
    assert list(wire) == ["x-trace"] and wire == propagated(call)
    propagate.set_global_textmap(propagate.get_global_textmap())  # the same one again
    assert dict(started_call(TracerProvider()).wire_context(0)).keys() == {"x-trace"}
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()]))
    assert dict(started_call(TracerProvider()).wire_context(0)).keys() == {"traceparent"}  # changed: seen
    propagate.set_global_textmap(CompositePropagator([W3CBaggagePropagator(), TraceContextTextMapPropagator()]))
    call = started_call(TracerProvider())
    assert dict(call.wire_context(0)) == propagated(call)  # not the default's order: the propagator's own


def test_a_propagator_set_after_the_channel_is_made_is_used_by_its_next_call(global_textmap: None) -> None:
    provider = TracerProvider()
    telemetry = Telemetry("127.0.0.1:1", None, None, provider)
    assert dict(started_call(provider, telemetry).wire_context(0)).keys() == {"traceparent"}
    propagate.set_global_textmap(Custom())
    assert dict(started_call(provider, telemetry).wire_context(0)).keys() == {"x-trace"}


def test_the_attempts_parent_is_what_set_span_in_context_makes() -> None:
    """grpc_retry sets the call's span in the caller's context itself (a dict item, as OpenTelemetry does), or
    through set_span_in_context when it cannot tell how OpenTelemetry does it: the same context either way."""
    token = context.attach(baggage.set_baggage("tenant", "a"))
    try:
        call = started_call(TracerProvider())
    finally:
        context.detach(token)
    assert call._channel._span_key is not None  # (the API installed here: its Context is known)
    expected = trace.set_span_in_context(call._span, call._context)
    assert call._parent == expected and type(call._parent) is type(expected)
    assert trace.get_current_span(call._parent) is call._span and baggage.get_all(call._parent) == {"tenant": "a"}
    call._channel._span_key = None
    made = call._channel.with_span(call._span, call._context)
    assert made == expected and type(made) is type(expected)


def test_the_callers_context_is_read_as_get_current_reads_it() -> None:
    """grpc_retry reads the caller's context from the context variable OpenTelemetry's runtime context keeps it
    in (probed when the channel is made), or through get_current when the runtime context is another: the same
    context either way, on whatever thread the call starts."""
    from grpc_retry._otel import current_context as _current_context

    telemetry = Telemetry("127.0.0.1:1", None, None, TracerProvider())
    assert telemetry._current is not context.get_current  # (the default runtime context here: its variable)
    seen: Dict[str, Any] = {}

    def start() -> None:
        token = context.attach(baggage.set_baggage("tenant", "b"))
        try:
            seen["now"] = context.get_current()
            seen["call"] = telemetry.observe("/echo.Echo/Unary", machine(), [])
        finally:
            context.detach(token)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert seen["call"]._context is seen["now"]
    assert telemetry._current() is context.get_current()  # (this thread: nothing attached)

    class Runtime:  # a runtime context of another kind
        _current_context = None

        def get_current(self) -> Any:
            return context.Context()

    class Api:
        _RUNTIME_CONTEXT = Runtime()
        get_current = staticmethod(lambda: "get_current")

    assert _current_context(Api)() == "get_current"
