# ring_hash (gRFC A42): a ring of XXH64 hashes, each endpoint on it as often as its share of the weight says. A
# call's request hash picks the first entry at or after it (wrapping), and the picker walks on from there. The ring
# is built as gRPC's C-core builds it, so that a request hash reaches the same endpoint through grpcio's client
# and this one: endpoints in their resolver's order; each one's entries hashed from "<key>_<n>" (its key: the
# address as "host:port", "[v6]:port"); a scale that gives the lightest endpoint ceil(its share x min size)
# entries, at most the max size; each endpoint's count the running total's ceiling less the previous one's.

from libc.stdlib cimport malloc, free, qsort
from libc.math cimport ceil

cdef unsigned long long _P1 = 11400714785074694791ULL
cdef unsigned long long _P2 = 14029467366897019727ULL
cdef unsigned long long _P3 = 1609587929392839161ULL
cdef unsigned long long _P4 = 9650029242287828579ULL
cdef unsigned long long _P5 = 2870177450012600261ULL

RING_SIZE_CAP = 4096  # grpc.lb.ring_hash.ring_size_cap's default: both sizes are cut to it
MAX_RING_SIZE = 8388608  # the largest size a config may ask for


cdef inline unsigned long long _rotl(unsigned long long x, int r):
    return (x << r) | (x >> (64 - r))


cdef inline unsigned long long _read64(const unsigned char *p):
    cdef unsigned long long v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline unsigned long long _read32(const unsigned char *p):
    return <unsigned long long>p[0] | (<unsigned long long>p[1] << 8) | (<unsigned long long>p[2] << 16) | \
        (<unsigned long long>p[3] << 24)


cdef inline unsigned long long _round(unsigned long long acc, unsigned long long lane):
    acc += lane * _P2
    return _rotl(acc, 31) * _P1


cdef inline unsigned long long _merge(unsigned long long h, unsigned long long v):
    h ^= _round(0, v)
    return h * _P1 + _P4


cdef unsigned long long _xxh64(const unsigned char *p, Py_ssize_t n, unsigned long long seed):
    cdef const unsigned char *end = p + n
    cdef unsigned long long h, v1, v2, v3, v4
    if n >= 32:
        v1, v2, v3, v4 = seed + _P1 + _P2, seed + _P2, seed, seed - _P1
        while p + 32 <= end:
            v1 = _round(v1, _read64(p))
            v2 = _round(v2, _read64(p + 8))
            v3 = _round(v3, _read64(p + 16))
            v4 = _round(v4, _read64(p + 24))
            p += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(_merge(_merge(_merge(h, v1), v2), v3), v4)
    else:
        h = seed + _P5
    h += <unsigned long long>n
    while p + 8 <= end:
        h ^= _round(0, _read64(p))
        h = _rotl(h, 27) * _P1 + _P4
        p += 8
    if p + 4 <= end:
        h ^= _read32(p) * _P1
        h = _rotl(h, 23) * _P2 + _P3
        p += 4
    while p < end:
        h ^= p[0] * _P5
        h = _rotl(h, 11) * _P1
        p += 1
    h ^= h >> 33
    h *= _P2
    h ^= h >> 29
    h *= _P3
    h ^= h >> 32
    return h


cpdef unsigned long long xxh64(bytes data, unsigned long long seed=0):
    """XXH64 of `data` (the hash gRPC's ring_hash uses, with seed 0)."""
    return _xxh64(<const unsigned char *>data, len(data), seed)


# (_Entry: grpc_retry/_core.pxd)
cdef int _by_hash(const void *a, const void *b) noexcept nogil:
    cdef unsigned long long x = (<_Entry *>a).hash, y = (<_Entry *>b).hash
    return -1 if x < y else (1 if x > y else 0)


cdef class Ring:
    """`endpoints`: (key, weight, slot) in the resolver's order (a weight of 0 counts as 1); sizes as the config
    asks, each cut to RING_SIZE_CAP."""

    def __cinit__(self, endpoints, long min_size=1024, long max_size=RING_SIZE_CAP):
        cdef double total = 0.0, least = 1.0, scale, current = 0.0, target = 0.0, share
        cdef long count, n = 0, cap
        cdef bytes key
        self._entries = NULL
        self.size = 0
        endpoints = [(k, w if w > 0 else 1, s) for k, w, s in endpoints]
        if not endpoints:
            return
        for _, weight, _ in endpoints:
            total += weight
        for _, weight, _ in endpoints:
            share = weight / total
            if share < least:
                least = share
        min_size = min(min_size, RING_SIZE_CAP)
        max_size = min(max_size, RING_SIZE_CAP)
        scale = min(ceil(least * min_size) / least, <double>max_size)
        cap = <long>ceil(scale) + len(endpoints)
        self._entries = <_Entry *>malloc(cap * sizeof(_Entry))
        if self._entries == NULL:
            raise MemoryError()
        for key_text, weight, slot in endpoints:
            target += scale * (weight / total)
            prefix = key_text.encode() + b"_"
            count = 0
            while current < target and n < cap:
                key = prefix + str(count).encode()
                self._entries[n].hash = _xxh64(<const unsigned char *>key, len(key), 0)
                self._entries[n].slot = slot
                n += 1
                count += 1
                current += 1.0
        qsort(self._entries, n, sizeof(_Entry), _by_hash)
        self.size = n

    def __dealloc__(self):
        free(self._entries)

    cdef int first(self, unsigned long long h):
        """The index of the first entry whose hash is at least `h` (0 past the last: the ring wraps)."""
        cdef int low = 0, high = self.size
        cdef int middle
        while low < high:
            middle = (low + high) >> 1
            if self._entries[middle].hash < h:
                low = middle + 1
            else:
                high = middle
        return 0 if low == self.size else low

    cdef int slot_at(self, int i):
        return self._entries[i].slot

    def entries(self):
        """(hash, slot) for each entry, in ring order."""
        return [(self._entries[i].hash, self._entries[i].slot) for i in range(self.size)]

    def start(self, unsigned long long h):
        """The slot a request hash `h` reaches first."""
        return self._entries[self.first(h)].slot if self.size else -1
