# Compiled as extension types (the .py stays their source): see _grpc_internals.pxd.

cpdef _debug_logged()

cdef class Telemetry:
    cdef public object target, throttle, metrics, meter_provider, tracer, _trace_api, _propagate, _baggage
    cdef public object _context_api, _client, _textmap, _span_context, _methods
    cpdef observe(self, method, machine, addresses)


cdef class CallTelemetry:
    cdef public object _channel, _method, _machine, _addresses, _tracing, _id, _started, _span, _context, _parent
    cdef public object _baggage, _attempt_spans, _where, _codes, _ended
