# Server-directed backoff: a google.rpc.RetryInfo among the details of the google.rpc.Status a server sends in the
# trailer grpc-status-details-bin (the convention of Google's APIs and of grpcio-status). Read straight from the
# protobuf wire format: the core depends on no generated code, and a status without details costs one key test.
#   Status    { int32 code = 1; string message = 2; repeated Any details = 3; }
#   Any       { string type_url = 1; bytes value = 2; }
#   RetryInfo { Duration retry_delay = 1; }
#   Duration  { int64 seconds = 1; int32 nanos = 2; }
# Anything malformed (truncated, a wrong wire type, a negative or out-of-range delay) reads as no RetryInfo.

cdef str STATUS_DETAILS_KEY = "grpc-status-details-bin"
cdef bytes RETRY_INFO_TYPE = b"type.googleapis.com/google.rpc.RetryInfo"
cdef double MAX_DURATION_SECONDS = 315576000000.0  # protobuf's Duration range


cdef Py_ssize_t _varint(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                        unsigned long long* out) noexcept:
    """Reads a varint at pos: the position after it, or -1 if malformed."""
    cdef unsigned long long value = 0
    cdef int shift = 0
    while pos < end and shift < 64:
        value |= <unsigned long long>(buf[pos] & 0x7f) << shift
        pos += 1
        if not buf[pos - 1] & 0x80:
            out[0] = value
            return pos
        shift += 7
    return -1


cdef Py_ssize_t _next_field(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, int* number,
                            unsigned long long* value, Py_ssize_t* start) noexcept:
    """Reads the field at pos: its number, and a varint's value, or a length-delimited field's bytes as
    [start, start + value). The position after it, or -1 if malformed."""
    cdef unsigned long long key
    pos = _varint(buf, pos, end, &key)
    if pos < 0:
        return -1
    number[0] = <int>(key >> 3)
    start[0] = -1
    wire = key & 7
    if wire == 0:
        return _varint(buf, pos, end, value)
    if wire == 2:
        pos = _varint(buf, pos, end, value)
        if pos < 0 or value[0] > <unsigned long long>(end - pos):
            return -1
        start[0] = pos
        return pos + <Py_ssize_t>value[0]
    if wire == 1 or wire == 5:
        value[0] = 0
        pos += 8 if wire == 1 else 4
        return pos if pos <= end else -1
    return -1


cdef double _duration(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end) noexcept:
    cdef long long seconds = 0, nanos = 0
    cdef unsigned long long value
    cdef Py_ssize_t start
    cdef int number
    while pos < end:
        pos = _next_field(buf, pos, end, &number, &value, &start)
        if pos < 0:
            return -1
        if number == 1 and start < 0:
            seconds = <long long>value
        elif number == 2 and start < 0:
            nanos = <long long>value
    if seconds < 0 or nanos < 0 or nanos > 999999999 or seconds > MAX_DURATION_SECONDS:
        return -1
    return seconds + nanos / 1e9


cdef double _retry_info(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end) noexcept:
    cdef double delay = -1
    cdef unsigned long long value
    cdef Py_ssize_t start
    cdef int number
    while pos < end:
        pos = _next_field(buf, pos, end, &number, &value, &start)
        if pos < 0:
            return -1
        if number == 1 and start >= 0:
            delay = _duration(buf, start, start + <Py_ssize_t>value)
    return delay


cdef double _any_retry_info(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end) noexcept:
    cdef Py_ssize_t value_start = -1, value_end = -1, start
    cdef bint is_retry_info = False
    cdef unsigned long long value
    cdef int number
    cdef Py_ssize_t n = len(RETRY_INFO_TYPE)
    cdef const unsigned char* type_url = RETRY_INFO_TYPE
    while pos < end:
        pos = _next_field(buf, pos, end, &number, &value, &start)
        if pos < 0:
            return -1
        if number == 1 and start >= 0:
            is_retry_info = <Py_ssize_t>value == n and memcmp(buf + start, type_url, n) == 0
        elif number == 2 and start >= 0:
            value_start, value_end = start, start + <Py_ssize_t>value
    if not is_retry_info or value_start < 0:
        return -1
    return _retry_info(buf, value_start, value_end)


cpdef double parse_retry_info(trailing_metadata) except? -2:
    """Seconds of the RetryInfo delay in trailing metadata (pairs of key, value), or -1 when there is none or it
    is malformed."""
    cdef const unsigned char* buf
    cdef Py_ssize_t pos = 0, end, start
    cdef unsigned long long value
    cdef int number
    cdef double delay
    if not trailing_metadata:
        return -1
    for key, details in trailing_metadata:
        if key != STATUS_DETAILS_KEY or not isinstance(details, bytes):
            continue
        buf = <bytes>details
        end = len(<bytes>details)
        while pos < end:
            pos = _next_field(buf, pos, end, &number, &value, &start)
            if pos < 0:
                return -1
            if number == 3 and start >= 0:
                delay = _any_retry_info(buf, start, start + <Py_ssize_t>value)
                if delay >= 0:
                    return delay
        return -1
    return -1


# The call machine's use of a RetryInfo delay.

cdef bint _honours(CallMachine self, double delay, double now):
    """Whether a server's RetryInfo delay is waited for: within the cap, and ending before the deadline."""
    return delay <= self.policy.max_server_delay and now + delay < self.deadline
