# Compiled as extension types (the .py stays their source): see setup.py. What a call's path calls is
# cpdef or cdef (C calls, from the drivers too: they cimport CallTelemetry), not looked up by name; `api`, the
# channel's Telemetry, is typed where a method reads it.

cimport cython

from grpc_retry._core cimport CallMachine, traceparent

# The machine's note kinds, attempt types and commit causes, as C ints (compared without a Python call)
cdef long NOTE_START, NOTE_STATUS, NOTE_BACKOFF, NOTE_HEDGE_NOW, NOTE_TRANSPARENT, NOTE_COMMIT, NOTE_STOP, NOTE_END
cdef long NOTE_RECV_TIMEOUT, NOTE_SERVER_DELAY
cdef long ORIGINAL, COMMIT_OVERFLOW

cdef dict _LOG_CACHE  # (its get() then a C call)
cdef dict _EVENT_ATTRIBUTES
cdef tuple _NAMES, _FIRST_ENDED, _FIRST_COMMITTED
cdef bint _is_decision(long kind) noexcept
cdef str _code_name(long code)
cdef dict _attributes(event, n, name, value)
cpdef _debug_logged()

cdef class _Metrics:
    cdef public object retries, transparent, hedges, retry_delay, duration, record_delay, record_duration
    cdef public object recv_timeouts, server_delays


cdef class CallTelemetry


cdef class Telemetry:
    cdef public _Metrics metrics
    cdef public object target, throttle, meter_provider, tracer, _trace_api, _propagate, _baggage
    cdef public object _context_api, _current, _client, _textmap, _span_context, _span_key, _no_state
    cdef public bint _textmap_global
    cdef public dict _methods, _ends, _attempts, _firsts, _hosts
    cpdef with_span(self, span, context)
    cdef bint _w3c_only(self) except -1
    cpdef tuple method(self, method)
    @cython.locals(call=CallTelemetry)
    cpdef observe(self, method, machine, addresses)


cdef class CallTelemetry:
    cdef public Telemetry _channel
    cdef public CallMachine _machine  # (its notes taken and its counts read as C calls and struct fields)
    cdef public object _method, _labels, _addresses, _tracing, _id, _started, _span, _context
    cdef public object _parent, _baggage, _ended, _span0
    cdef long _code0
    cdef public dict _attempt_spans, _where, _codes
    @cython.locals(channel=Telemetry, machine=CallMachine, addresses=list)
    cdef _begin(self, channel, method, machine, addresses, bint tracing)
    @cython.locals(api=Telemetry)
    cdef _start_call(self)
    @cython.locals(api=Telemetry)
    cpdef tuple wire_context(self, n)
    @cython.locals(notes=list, note=tuple, kind=long, count=Py_ssize_t, i=Py_ssize_t)
    cpdef flush(self)
    @cython.locals(api=Telemetry, n=long, address=long, previous=long, why=long, first=bint)
    cdef _start(self, note, tracing)
    @cython.locals(n=long, code=long, timed_out=bint)
    cdef _status(self, note, decision, tracing)
    cdef _decision(self, note, tracing)
    @cython.locals(n=long, cause=long)
    cdef _commit(self, note, tracing)
    @cython.locals(ends=dict, machine=CallMachine, metrics=_Metrics, reason=long, code=long, n=long, attempts=long,
                   retries=long, hedges=long, transparent=long, key=long)
    cdef _end(self, note, tracing)
    cdef _end_attempt_span(self, long n, name, long code)
    cdef _event(self, name, attributes)
