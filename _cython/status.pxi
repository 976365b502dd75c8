# gRPC status codes as integers: the core works on their numbers, never on grpc.StatusCode objects.
cdef enum:
    STATUS_OK = 0
    STATUS_CANCELLED = 1
    STATUS_DEADLINE_EXCEEDED = 4
    STATUS_UNAVAILABLE = 14
