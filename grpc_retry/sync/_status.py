"""The sync API's frozen results: a call's final non-OK status (what grpcio raises), and the grpc.Call of a
successful call whose trailing metadata grpc_retry extended."""

from __future__ import annotations

import sys
from typing import Optional

import grpc

_OK = grpc.StatusCode.OK


class _Ended(grpc.Call):
    """What a call that has ended answers, whatever its status."""

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False



class RpcError(grpc.RpcError, _Ended, grpc.Future):
    """A call's final non-OK status, frozen: what grpcio raises, with grpc_retry's trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: Optional[str], initial=(), trailing=(),
                 debug: Optional[str] = None):
        super().__init__()
        self._code, self._details, self._initial, self._trailing, self._debug = (
            code, details, initial, trailing, debug)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return self._initial

    def trailing_metadata(self):
        return self._trailing

    def debug_error_string(self):
        return self._debug

    def cancelled(self):
        return self._code == grpc.StatusCode.CANCELLED

    def running(self):
        return False

    def done(self):
        return True

    def result(self, timeout=None):
        raise self

    def exception(self, timeout=None):
        return self

    def traceback(self, timeout=None):
        return traceback_of(self)

    def add_done_callback(self, fn):
        fn(self)

    def __str__(self):
        return (f"<{type(self).__name__} of RPC that terminated with:\n\tstatus = {self._code}\n"
                f"\tdetails = \"{self._details}\"\n\tdebug_error_string = \"{self._debug}\"\n>")

    __repr__ = __str__


class FinishedCall(_Ended):
    """The grpc.Call of a successful call whose trailing metadata grpc_retry extended."""

    def __init__(self, attempt: grpc.Call, trailing):
        self._attempt, self._trailing = attempt, trailing

    def initial_metadata(self):
        return self._attempt.initial_metadata()

    def trailing_metadata(self):
        return self._trailing

    def code(self):
        return _OK

    def details(self):
        return self._attempt.details()


def local_error(code: grpc.StatusCode, details: str) -> RpcError:
    """A status no server sent (deadline, cancel, a local failure)."""
    return RpcError(code, details, (), (), None)


def traceback_of(error: BaseException):
    """The traceback of a failed future, as grpcio gives it: of the error raised from traceback() itself."""
    try:
        raise error
    except BaseException:
        return sys.exc_info()[2]
