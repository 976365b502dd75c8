# Server pushback (A6 "Pushback"): trailer grpc-retry-pushback-ms. A single value that is an ASCII signed
# 32-bit integer; >= 0 means "retry after exactly that many ms", anything else means "do not retry".

cdef enum:
    PUSHBACK_NONE = -1      # no pushback trailer
    PUSHBACK_STOP = -2      # negative, unparseable or repeated: do not retry

cdef str PUSHBACK_KEY = "grpc-retry-pushback-ms"


cdef long parse_pushback_value(value) except -3:
    cdef str text
    if isinstance(value, bytes):
        try:
            text = (<bytes>value).decode("ascii")
        except UnicodeDecodeError:
            return PUSHBACK_STOP
    elif isinstance(value, str):
        text = <str>value
    else:
        return PUSHBACK_STOP
    if not text or len(text) > 11:
        return PUSHBACK_STOP
    if text[0] == "-":
        # A well-formed negative number is an explicit "do not retry", as is anything malformed.
        return PUSHBACK_STOP
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        return PUSHBACK_STOP
    cdef long ms = int(text)
    if ms > 2147483647:
        return PUSHBACK_STOP
    return ms


cpdef long parse_pushback(trailing_metadata) except -3:
    """Milliseconds of pushback in trailing metadata (pairs of key, value), or PUSHBACK_NONE / _STOP."""
    cdef long result = PUSHBACK_NONE
    if not trailing_metadata:
        return PUSHBACK_NONE
    for key, value in trailing_metadata:
        if key == PUSHBACK_KEY:
            if result != PUSHBACK_NONE:
                return PUSHBACK_STOP
            result = parse_pushback_value(value)
    return result
