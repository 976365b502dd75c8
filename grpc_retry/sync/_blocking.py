"""The blocking sync unary call (BlockingCall): its attempts run inline on the caller's thread, one at a time, each
as one exchange on grpcio's call."""

from __future__ import annotations

from time import monotonic
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

import grpc

from grpc_retry._core import CallMachine
from grpc_retry._transport import transport as internals

if TYPE_CHECKING:
    from grpc_retry._core import Action  # (kind, attempt, argument): an action the machine decided

from grpc_retry._driver import (
    CANCELLED_DETAILS,
    CLOSED_DETAILS,
    DEADLINE_DETAILS,
    INF,
    grpc_details,
)
from grpc_retry.sync._attempts import (
    _Attempts,
)

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED


class BlockingCall(_Attempts):
    """A unary-unary call with no hedging, run inline on the caller's thread: each attempt is grpcio's own
    blocking call; backoff and waits for a subchannel block this thread too.

    An attempt timed by perAttemptRecvTimeout is one batch here only while its method's server is seen sending
    headers with its responses (Method.first_whole): it has not answered before its response, so its timer is its
    grpcio deadline, and a local deadline before the call's is its timer firing."""

    __slots__ = ("_next", "_timer_at", "_generation", "_ended", "_last", "_local_details", "_with_call")

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> None:
        self._init_attempts(method, machine, request, metadata, credentials, wait_for_ready, compression, False)
        self._next: Optional[Tuple[Any, ...]] = None
        self._timer_at = INF
        self._generation = -1
        self._ended = False
        self._last: Any = None
        self._local_details = CANCELLED_DETAILS

    def run(self, with_call: bool) -> Any:
        self._with_call = with_call
        calls = self._method.calls
        calls.add(self)
        try:
            return self._run()
        finally:
            calls.discard(self)

    def close_channel(self) -> None:
        """The channel is closing: an attempt in a blocking grpcio call ends with the subchannel's close, a wait
        for backoff or for a subchannel by itself, on the caller's thread."""

    def closed(self, timeout: float) -> None:
        pass

    def _run(self) -> Any:
        machine = self._machine
        subchannels = self._method.subchannels
        actions = machine.start(monotonic(), self._request)
        while True:
            self._act(actions)
            if self._ended:
                break
            if self._next is not None:
                actions = self._attempt(*self._next)
                continue
            now = monotonic()
            subchannels.wait_change(None if self._timer_at == INF else max(self._timer_at - now, 0.0),
                                    self._generation if self._generation >= 0 else None)
            if self._method.closed():
                self._local_details = CLOSED_DETAILS
                actions = machine.cancel(1, monotonic())
            elif self._generation >= 0 and subchannels.generation != self._generation:
                self._generation = -1
                actions = machine.subchannels_changed(monotonic())
            elif monotonic() >= self._timer_at:
                self._timer_at = INF
                actions = machine.timer(monotonic())
            else:
                actions = []
        if self._error is not None:
            raise self._error
        return (self._response, self._final) if self._with_call else self._response

    def _attempt(self, n: int, address: int, previous: int) -> List[Action]:
        self._next = None
        inner = self._method.inner(address)
        if self._method.headers_first:  # (a timed call's method: its attempts' shape shows headers first)
            inner = inner.multicallable
        try:
            if self._with_call:
                self._method.attempt_started(address)  # (grpcio's blocking call: no moment between is ours)
                response, call = inner.with_call(self._request, **self._kwargs(n, address, previous))
            elif (own := internals.sync_own()) is not None:  # no call object wanted: the transport's own exchange
                request = self._request
                assert request is not None  # (not typing.cast(): compiled, that is still a Python function's call)
                started, receiving = own.unary_start(
                    inner, request, self._timeout(), self._attempt_metadata(n, previous), self._credentials,
                    self._grpc_wfr, self._compression)
                self._method.attempt_started(address)
                ended = own.unary_end(started, receiving)
                state = ended._state
                code = state.code
                assert code is not None
                if code is not _OK:
                    if code is _DEADLINE_EXCEEDED and self._timed_out(state.details, state.initial_metadata):
                        return self._machine.timer(max(monotonic(), self._timer_at))
                    self._last = ended, None
                    return self._machine.status(n, code.value[0], state.details, state.trailing_metadata,
                                                monotonic(), bool(state.initial_metadata))
                response, call = state.response, None
            else:  # grpcio's observability plugin records its own blocking calls: grpcio's, then
                self._method.attempt_started(address)
                response, call = inner(self._request, **self._kwargs(n, address, previous)), None
        except grpc.RpcError as error:
            code, details, trailing, _, initial = internals.sync_status(error)
            if code is _DEADLINE_EXCEEDED and self._timed_out(details, initial):
                return self._machine.timer(max(monotonic(), self._timer_at))
            self._last = error, None
            return self._machine.status(n, code.value[0], details, trailing, monotonic(), bool(initial))
        self._last = call, response
        return self._machine.status(n, 0, None, None, monotonic())

    def _timeout(self) -> Optional[float]:
        """An attempt's timeout: what is left of the call's deadline, or of the attempt's perAttemptRecvTimeout
        (the machine's timer while an attempt is out) when that comes first."""
        at = self._machine.deadline
        if self._timer_at < at:
            at = self._timer_at
        return None if at == INF else at - monotonic()

    def _timed_out(self, details: Any, initial: Any) -> bool:
        """Whether an attempt that ended DEADLINE_EXCEEDED ended at its perAttemptRecvTimeout (its deadline
        here, by grpcio's own timer, before the call's). Headers seen with it mean the server sends them ahead of
        its response: the method's attempts show them first from then on."""
        if self._timer_at >= self._machine.deadline or grpc_details(details, False) != DEADLINE_DETAILS:
            return False
        if initial:
            self._method.headers_early()
        return True

    def _start(self, n: int, address: int, previous: int) -> None:
        self._next = (n, address, previous)

    def _arm(self, at: float) -> None:
        self._timer_at = at

    def _wait(self, generation: int) -> None:
        self._generation = generation

    def _unwait(self) -> None:
        self._generation = -1

    def _deliver(self, n: int) -> None:
        call, response = self._last
        self._outcome(call, self._machine.previous(n), response)
        self._ended = True

    def _end(self, code: int) -> None:
        self._local(code, self._local_details)
        self._ended = True

    def _write(self, n: int, data: bytes) -> None:  # a unary request goes with its attempt
        pass

    def _half_close(self, n: int) -> None:
        pass

    def _commit(self, n: int) -> None:
        pass

    def _cancel_attempt(self, n: int) -> None:  # never: the one attempt has ended whenever the machine decides
        pass
