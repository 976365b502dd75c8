"""The sync API's frozen results: a call's final non-OK status (what grpcio raises), and the grpc.Call of a
successful call that grpc_retry's own attempt shapes made, or whose trailing metadata it extended."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, Callable, Optional, Tuple

import grpc

Metadata = Tuple[Any, ...]  # (key, value) pairs

_OK = grpc.StatusCode.OK
CLOSED_CHANNEL = "Cannot invoke RPC on closed channel!"  # grpcio's words


class _Ended(grpc.Call):
    """What a call that has ended answers, whatever its status."""

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> Optional[float]:  # type: ignore[override]  # grpcio's is Optional
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False



class RpcError(grpc.RpcError, _Ended, grpc.Future):  # type: ignore[type-arg]
    """A call's final non-OK status, frozen: what grpcio raises, with grpc_retry's trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: Optional[str], initial: Metadata = (), trailing: Metadata = (),
                 debug: Optional[str] = None) -> None:
        super().__init__()
        self._code, self._details, self._initial, self._trailing, self._debug = (
            code, details, initial, trailing, debug)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:  # type: ignore[override]  # None when the status had none
        return self._details

    def initial_metadata(self) -> Metadata:
        return self._initial

    def trailing_metadata(self) -> Metadata:
        return self._trailing

    def debug_error_string(self) -> Optional[str]:
        return self._debug

    def cancelled(self) -> bool:
        return self._code == grpc.StatusCode.CANCELLED

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: Optional[float] = None) -> Any:
        raise self

    def exception(self, timeout: Optional[float] = None) -> Exception:
        return self

    def traceback(self, timeout: Optional[float] = None) -> Optional[TracebackType]:
        return traceback_of(self)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)

    def __str__(self) -> str:
        return (f"<{type(self).__name__} of RPC that terminated with:\n\tstatus = {self._code}\n"
                f"\tdetails = \"{self._details}\"\n\tdebug_error_string = \"{self._debug}\"\n>")

    __repr__ = __str__


class FinishedCall(_Ended, grpc.Future):  # type: ignore[type-arg]  # grpcio's Future is not generic
    """The grpc.Call (and grpc.Future, as grpcio's) of a successful call: its winning attempt, with the trailing
    metadata grpc_retry extended."""

    def __init__(self, attempt: grpc.Call, trailing: Metadata, response: Any) -> None:
        self._attempt, self._trailing, self._response = attempt, trailing, response

    def initial_metadata(self) -> Metadata:
        return self._attempt.initial_metadata()

    def trailing_metadata(self) -> Metadata:
        return self._trailing

    def code(self) -> grpc.StatusCode:
        return _OK

    def details(self) -> str:
        return self._attempt.details()

    def debug_error_string(self) -> Optional[str]:
        return self._attempt.debug_error_string()  # type: ignore[no-any-return, attr-defined]  # each attempt's has it

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: Optional[float] = None) -> Any:
        return self._response

    def exception(self, timeout: Optional[float] = None) -> Optional[Exception]:
        return None

    def traceback(self, timeout: Optional[float] = None) -> Optional[TracebackType]:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


def local_error(code: grpc.StatusCode, details: str) -> RpcError:
    """A status no server sent (deadline, cancel, a local failure)."""
    return RpcError(code, details, (), (), None)


def traceback_of(error: BaseException) -> Optional[TracebackType]:
    """The traceback of a failed future, as grpcio gives it: of the error raised from traceback() itself."""
    try:
        raise error
    except BaseException:
        return sys.exc_info()[2]
