"""The standard policy for gRPC: `grpc.RpcError` classified by status code, server pushback honoured."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Any, Mapping, Optional

import grpc

from grpc_retry.strategy._types import (
    Outcome,
    RetryDirective,
    RetryError,
    RetryErrorType,
    RetryPolicy,
    TerminateAndFail,
    TerminateAndSucceed,
)

DEFAULT_STATUS_CODES: Mapping[grpc.StatusCode, RetryErrorType] = MappingProxyType({
    grpc.StatusCode.UNAVAILABLE: RetryErrorType.SERVER_SIDE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RetryErrorType.THROTTLING,
    grpc.StatusCode.DEADLINE_EXCEEDED: RetryErrorType.TIMEOUT,
    # "the client should retry at a higher level", e.g. restart a read-modify-write: what this module is for.
    grpc.StatusCode.ABORTED: RetryErrorType.CLIENT_SIDE,
})

_PUSHBACK_KEY = "grpc-retry-pushback-ms"
_PUSHBACK_STOP = -1


def _call_getter(error: BaseException, name: str) -> Any:
    getter = getattr(error, name, None)
    try:
        return getter() if callable(getter) else None
    except Exception:  # a half-built error must not break the policy
        return None


def _pushback_ms(trailing_metadata: Any) -> Optional[int]:
    """Server pushback in ms, None when there is none, `_PUSHBACK_STOP` when the value is negative, malformed
    or repeated (A6: the server asks not to retry). Same rules as the compiled core."""
    found: Optional[int] = None
    for key, value in trailing_metadata or ():
        if key != _PUSHBACK_KEY:
            continue
        if found is not None:
            return _PUSHBACK_STOP
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if (not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 10
                or (len(value) > 1 and value[0] == "0") or int(value) > 2**31 - 1):
            return _PUSHBACK_STOP
        found = int(value)
    return found


class StandardRetryPolicy(RetryPolicy[Any]):
    """Succeeds on any value. Classifies an exception in tiers, the first that answers wins:

    1. a `grpc.RpcError` whose code is in `status_codes` (default `DEFAULT_STATUS_CODES`) is retried for that
       reason, after exactly the `grpc-retry-pushback-ms` trailer's delay if there is one; a negative, malformed
       or repeated pushback means do not retry;
    2. `TimeoutError` / `asyncio.TimeoutError` -> TIMEOUT, `ConnectionError` -> SERVER_SIDE;
    3. `evaluate_other_exceptions`, for subclasses;
    4. anything else, every other status code included, terminates and fails.
    """

    def __init__(self, status_codes: Optional[Mapping[grpc.StatusCode, RetryErrorType]] = None, *,
                 pushback: bool = True) -> None:
        self.status_codes = MappingProxyType(dict(DEFAULT_STATUS_CODES if status_codes is None else status_codes))
        self.pushback = pushback

    def evaluate(self, outcome: Outcome[Any]) -> RetryDirective:
        if outcome.exception is None:
            return TerminateAndSucceed
        error = outcome.exception
        return (self._evaluate_rpc_error(error) or self._evaluate_builtin_exception(error)
                or self.evaluate_other_exceptions(error) or TerminateAndFail)

    def evaluate_other_exceptions(self, error: BaseException) -> Optional[RetryDirective]:
        """Override to classify exceptions the standard tiers leave alone; None falls through to TerminateAndFail."""
        return None

    def _evaluate_rpc_error(self, error: BaseException) -> Optional[RetryDirective]:
        if not isinstance(error, grpc.RpcError):
            return None
        reason = self.status_codes.get(_call_getter(error, "code"))
        if reason is None:
            return None
        ms = _pushback_ms(_call_getter(error, "trailing_metadata")) if self.pushback else None
        if ms == _PUSHBACK_STOP:
            return TerminateAndFail
        return RetryError(reason, None if ms is None else ms / 1000.0)

    @staticmethod
    def _evaluate_builtin_exception(error: BaseException) -> Optional[RetryDirective]:
        if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
            return RetryError(RetryErrorType.TIMEOUT)
        if isinstance(error, ConnectionError):
            return RetryError(RetryErrorType.SERVER_SIDE)
        return None
