"""What the sync call driver's base holds (`_Attempts`: an attempt's arguments, and the call's outcome as the
application sees it) and its small helpers. The driver: sync/_driver.py, sync/_caller.py, sync/_call.py."""

from __future__ import annotations

from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import grpc

from grpc_retry._core import CallMachine
from grpc_retry._transport import transport as internals

if TYPE_CHECKING:
    pass  # (kind, attempt, argument): an action the machine decided

from grpc_retry._driver import (
    INF,
    CallDriver,
    grpc_details,
    local_status,
    log,
)
from grpc_retry._driver import trailing_with_attempts as trailing_of
from grpc_retry._method import DESERIALIZE_FAILED, UNDESERIALIZABLE
from grpc_retry.sync._status import FinishedCall, RpcError, local_error

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED
ENDED = object()  # an attempt's read found its end
HALF_CLOSE = object()  # an attempt's requests are all sent


class _Attempts(CallDriver):
    """How a call starts attempts and tells what ended it: shared by the blocking and the non-blocking call."""

    __slots__ = ("_error", "_response", "_final")

    def _init_attempts(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any,
                       credentials: Any, wait_for_ready: Optional[bool], compression: Any,
                       stream_request: bool) -> None:
        """What its subclasses' constructors do first (see CallDriver._init_driver)."""
        self._init_driver(method, machine, request, metadata, credentials, wait_for_ready, compression,
                          stream_request)
        self._error: Optional[RpcError] = None
        self._response: Any = None
        self._final: Any = None   # with OK: the attempt whose result the application gets

    def _kwargs(self, n: int, address: int, previous: int) -> Dict[str, Any]:
        return dict(timeout=self._timeout(), metadata=self._attempt_metadata(n, previous),
                    credentials=self._credentials, wait_for_ready=self._grpc_wfr, compression=self._compression)

    def _timeout(self) -> Optional[float]:
        """An attempt's timeout: what is left of the call's deadline (None: no deadline)."""
        deadline = self._machine.deadline
        return None if deadline == INF else deadline - monotonic()

    def _outcome(self, call: Any, previous: int, response: Any, delivered: bool = False) -> None:
        """The call ends with ended attempt `call`'s result (None: it succeeded, and only its response is wanted).
        `delivered`: a response message of it reached the application."""
        trailing = None
        if call is not None and (previous > 0 or internals.sync_code(call) is not _OK):
            code, details, trailing, debug, initial = internals.sync_status(call)
            if previous > 0:
                trailing = trailing_of(trailing, previous)
            if code is not _OK:
                self._error = RpcError(code, grpc_details(details, delivered or bool(initial),
                                                          self._method.subchannels), initial, trailing, debug)
                return
        if response is not None and self._method.deserializer is not None:
            response = self._method.deserialize(response)
            if response is UNDESERIALIZABLE:
                self._error = local_error(grpc.StatusCode.INTERNAL, DESERIALIZE_FAILED)
                return
        self._response = response
        if trailing is not None and previous > 0:
            self._final = FinishedCall(call, trailing, response)
        elif call is not None and (response is not None and self._method.deserializer is not None
                                   or internals.FINAL_WRAPPED):
            self._final = internals.sync_final(call, response)  # its result(), as grpcio's: the response, deserialized
        else:
            self._final = call

    def _local(self, code: int, details: str) -> None:
        self._error = local_error(*local_status(code, details, self._method.subchannels, self._machine))


def requests_of(request_iterator: Any) -> Any:
    """The application's requests; one that cannot be iterated fails the call when its first request is due, as
    on grpcio (UNKNOWN, "Exception iterating requests!"), not at the call site."""
    try:
        return iter(request_iterator)
    except TypeError as error:
        return _raising(error)


def _raising(error: Exception) -> Any:
    raise error
    yield  # a generator


def read_message(call: Any) -> Any:
    """An attempt's next message, or ENDED when it has ended (its status then tells how)."""
    try:
        return next(call)
    except (StopIteration, grpc.RpcError):
        return ENDED


def run_callback(callback: Callable[..., None], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:
        log.exception("callback of a grpc_retry call failed")
