# Transparent retries (A6 "Transparent Retries"): attempts the server's application never saw.
NOT_SENT = 0        # never left the client (no connection): retried while the deadline allows
REFUSED = 1         # refused by the server (REFUSED_STREAM, GOAWAY): retried once per call


cpdef int transparent_kind(int code, details):
    """NOT_SENT, REFUSED or -1, from an attempt's status as grpcio reports it. grpcio gives Python nothing but
    the status to tell these apart, so this reads C-core's wording (tests/faults checks it against a real HTTP/2
    peer)."""
    if code != STATUS_UNAVAILABLE or not details:
        return -1
    if "RST_STREAM with error code 7" in details or "GOAWAY received" in details:
        return REFUSED
    # (pick_first's words, on a subchannel; round_robin's and xDS's, on a grpcio channel given a whole target)
    if details.startswith(("failed to connect to all addresses", "connections to all backends failing")):
        return NOT_SENT
    return -1


cdef class _Redo:
    """A transparent retry waiting for an address: it stands in for an attempt already counted."""


cdef bint _redo(CallMachine self, _Attempt a, int kind, double now) except -1:
    """Whether attempt `a`, which the server's application never saw, goes again transparently."""
    cdef _Redo r
    cdef int address
    if (not self.transparent_enabled or now >= self.deadline or self.base != 0
            or (kind == REFUSED and self._refused_retried)):
        return False
    r = _Redo()
    r.previous = a.previous
    r.since = -1
    if kind == NOT_SENT:
        # It never left the client: worth another go only on an address this call has not tried, or, for a
        # call that waits for ready, on any address once the subchannels have news.
        address = _pick(self)
        if address < 0 or (self._used >> address) & 1:
            if not self.wait_for_ready:
                return False
            r.since = a.generation
    else:
        self._refused_retried = True
    self.transparent_retries += 1
    if self.winner >= 0:
        self.winner = -1    # the retry will carry the committed call
    self._redos.append(r)
    return True
