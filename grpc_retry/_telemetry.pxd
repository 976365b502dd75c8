# Compiled as extension types (the .py stays their source): see _grpc_internals.pxd. What a call's path calls is
# cpdef or cdef (C calls, from the drivers too: they cimport CallTelemetry), not looked up by name; `api`, the
# channel's Telemetry, is typed where a method reads it.

cimport cython

from grpc_retry._core cimport CallMachine, traceparent

cdef dict _LOG_CACHE  # (its get() then a C call)
cdef dict _EVENT_ATTRIBUTES
cdef dict _attributes(event, n, name, value)
cpdef _debug_logged()

cdef class _Metrics:
    cdef public object retries, transparent, hedges, retry_delay, duration, record_delay, record_duration


cdef class Telemetry:
    cdef public _Metrics metrics
    cdef public object target, throttle, meter_provider, tracer, _trace_api, _propagate, _baggage
    cdef public object _context_api, _current, _client, _textmap, _span_context, _span_key, _no_state
    cdef public bint _textmap_global
    cdef public dict _methods, _ends, _attempts, _hosts
    cpdef with_span(self, span, context)
    cdef bint _w3c_only(self) except -1
    cpdef tuple method(self, method)
    cpdef observe(self, method, machine, addresses)


cdef class CallTelemetry:
    cdef public Telemetry _channel
    cdef public CallMachine _machine  # (its notes taken and its counts read as C calls and struct fields)
    cdef public object _method, _labels, _addresses, _tracing, _id, _started, _span, _context
    cdef public object _parent, _baggage, _ended
    cdef public dict _attempt_spans, _where, _codes
    @cython.locals(api=Telemetry)
    cdef _start_call(self)
    @cython.locals(api=Telemetry)
    cpdef tuple wire_context(self, n)
    cpdef flush(self)
    @cython.locals(api=Telemetry)
    cdef _start(self, note, tracing)
    cdef _status(self, note, decision, tracing)
    cdef _decision(self, note, tracing)
    cdef _commit(self, note, tracing)
    @cython.locals(ends=dict, machine=CallMachine, metrics=_Metrics)
    cdef _end(self, note, tracing)
    cdef _end_attempt_span(self, n, name, code)
    cdef _event(self, name, attributes)
