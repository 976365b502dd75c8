# W3C Trace Context's traceparent header, as the telemetry puts an attempt's span on the wire: formatted into one C
# buffer and made a str once (in Python, the two ids' hex cost ~5k instructions a call: a bytes and a str each,
# and the joins).

cdef const char *_HEX_DIGITS = b"0123456789abcdef"


cdef inline void _hex(char *out, unsigned long long value, int digits) noexcept:
    """The last `digits` hex digits of `value` into out[0:digits], lower case, most significant first."""
    cdef int i
    for i in range(digits - 1, -1, -1):
        out[i] = _HEX_DIGITS[value & 15]
        value >>= 4


cpdef str traceparent(object trace_id, object span_id, object flags):
    """Version 00's traceparent, "00-<trace id>-<span id>-<flags>", as OpenTelemetry's propagator writes it: the
    ids as 32 and 16 hex digits, the flags as 2. Raises OverflowError for ids that do not fit their 16 and 8 bytes
    (a valid span context's always do)."""
    cdef char header[55]
    if not 0 <= flags < 256:  # (not a byte: written in full, as the propagator's format writes it)
        return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
    cdef unsigned long long high = trace_id >> 64
    cdef unsigned long long low = PyLong_AsUnsignedLongLongMask(trace_id)  # (its low 64 bits: no int made)
    cdef unsigned long long span = span_id
    cdef unsigned char flag_byte = flags
    header[0] = b'0'
    header[1] = b'0'
    header[2] = b'-'
    _hex(header + 3, high, 16)
    _hex(header + 19, low, 16)
    header[35] = b'-'
    _hex(header + 36, span, 16)
    header[52] = b'-'
    _hex(header + 53, flag_byte, 2)
    return header[:55].decode("ascii")
