# gRPC status codes as integers: the core works on their numbers, never on grpc.StatusCode objects.
cdef enum:
    STATUS_OK = 0
    STATUS_CANCELLED = 1
    STATUS_DEADLINE_EXCEEDED = 4
    STATUS_UNAVAILABLE = 14

# Why a call ended (machine.reason), for telemetry.
cdef enum:
    R_NONE = 0
    R_OK = 1
    R_FATAL = 2             # a status the policy does not retry
    R_EXHAUSTED = 3         # maxAttempts reached
    R_THROTTLED = 4
    R_PUSHBACK = 5          # the server said "do not retry"
    R_COMMITTED = 6         # committed (headers, a message, overflow), then failed
    R_DEADLINE = 7
    R_CANCELLED = 8         # the application (or the channel's close, or a local failure) ended it
    R_NO_ADDRESS = 9        # no backend could take the next attempt, and the call fails fast
    R_BUDGET = 10           # a due hedge was not sent for the extra-load budget, and the attempts sent failed
    R_RECV_TIMEOUT = 11     # the last attempt's perAttemptRecvTimeout fired, and no other may follow
    R_SERVER_DELAY = 12     # the server's RetryInfo asked for a delay past the deadline or the cap
    R_RETRY_BUDGET = 13     # the retry budget refused a retry or hedge, and the attempts sent failed
    R_FAULT = 14            # an xDS fault filter aborted the call (gRFC A33): no attempt was sent

REASONS = ("", "ok", "fatal_status", "attempts_exhausted", "throttled", "pushback_stop", "committed_then_failed",
           "deadline", "cancelled", "no_address", "hedge_budget", "attempt_timeout", "server_delay",
           "retry_budget", "fault_injected")

