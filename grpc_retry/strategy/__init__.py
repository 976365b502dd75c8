"""Application-level retries: a generic retryer for whole operations (seed `smithy-kotlin-retry-design.md`).

A `RetryStrategy` runs a block -- an operation that may make several RPCs -- at least once. A `RetryPolicy` judges
each try's `Outcome` and answers with a `RetryDirective`: `TerminateAndSucceed`, `TerminateAndFail`, or
`RetryError(reason)` with a `RetryErrorType`. `StandardRetryStrategy` adds `max_attempts`, a total time limit, a
backoff before each retry and a token bucket that each retry must draw on, priced by the error type.

Put it over channels made with `("grpc.enable_retries", 0)` (A6 "Disabling Retries"): then it is the only layer that
retries, and each try of the block is one RPC attempt per call on the wire.

Theory of operation (`_strategy.py`): every decision lives in one generator, `StandardRetryStrategy._plan`. It
never runs the block and never sleeps; it yields `_RUN` ("run the block and send me its outcome") or a number of
seconds ("sleep this long, then resume me") and finally returns the outcome to deliver, or raises a
`RetryStrategyError`. `retry` and `retry_async` are the two thin loops that drive it, so sync and asyncio cannot
drift apart. The other modules: `_types.py` (the design's vocabulary and interfaces), `_bucket.py` (the token
bucket), `_grpc.py` (the standard policy for gRPC).
"""

from grpc_retry.strategy._bucket import DEFAULT_RETRY_COSTS, StandardRetryTokenBucket
from grpc_retry.strategy._grpc import DEFAULT_STATUS_CODES, StandardRetryPolicy
from grpc_retry.strategy._strategy import (
    ExponentialBackoff,
    RetryStrategy,
    StandardRetryStrategy,
    StandardRetryStrategyOptions,
)
from grpc_retry.strategy._types import (
    BackoffDelayer,
    CapacityUnavailable,
    Outcome,
    ResultRejectedError,
    RetryCapacityExceededError,
    RetryDirective,
    RetryError,
    RetryErrorType,
    RetryPolicy,
    RetryStrategyError,
    RetryTimeoutError,
    RetryToken,
    RetryTokenBucket,
    TerminateAndFail,
    TerminateAndSucceed,
    TooManyAttemptsError,
)

__all__ = [
    "DEFAULT_RETRY_COSTS",
    "DEFAULT_STATUS_CODES",
    "BackoffDelayer",
    "CapacityUnavailable",
    "ExponentialBackoff",
    "Outcome",
    "ResultRejectedError",
    "RetryCapacityExceededError",
    "RetryDirective",
    "RetryError",
    "RetryErrorType",
    "RetryPolicy",
    "RetryStrategy",
    "RetryStrategyError",
    "RetryTimeoutError",
    "RetryToken",
    "RetryTokenBucket",
    "StandardRetryPolicy",
    "StandardRetryStrategy",
    "StandardRetryStrategyOptions",
    "StandardRetryTokenBucket",
    "TerminateAndFail",
    "TerminateAndSucceed",
    "TooManyAttemptsError",
]
