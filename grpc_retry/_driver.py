"""What the two drivers share: performing the call machine's actions, attempt metadata, and the texts of the
statuses grpc_retry ends a call with. A driver subclasses CallDriver and supplies the I/O of each action."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence, Tuple

import grpc

from grpc_retry._core import (
    CANCEL,
    COMMIT,
    DELIVER,
    END,
    FLUSH,
    HALF_CLOSE,
    START,
    TIMER,
    UNWAIT,
    WAIT,
    WRITE,
    CallMachine,
)

if TYPE_CHECKING:
    from grpc_retry._core import Action  # (kind, attempt, argument): an action the machine decided
    from grpc_retry._telemetry import CallTelemetry


log = logging.getLogger("grpc_retry")

PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"
CANCELLED_DETAILS = "Locally cancelled by application!"
DEADLINE_DETAILS = "Deadline Exceeded"
FAULT_DETAILS = "Fault injected"  # an xDS fault filter's abort, as grpcio words it (A33)
RECV_TIMEOUT_DETAILS = "Stream removed (retry perAttemptRecvTimeout exceeded)"  # grpcio's, when the last one fires
CLOSED_DETAILS = "Channel closed!"
INTERNAL_DETAILS = "grpc_retry internal error"
INF = float("inf")

STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}

MetadataPairs = Tuple[Tuple[str, Any], ...]


def attempt_metadata(metadata: MetadataPairs, previous: int) -> MetadataPairs:
    """The metadata of an attempt with `previous` counted attempts before it (A6 "Exposed Retry Metadata")."""
    return metadata if previous == 0 else metadata + ((PREVIOUS_ATTEMPTS, str(previous)),)


def _replaced(metadata: MetadataPairs, pairs: MetadataPairs) -> MetadataPairs:
    """`metadata` with `pairs` in place of its pairs of the same keys."""
    keys = {key for key, _ in pairs}
    return tuple(pair for pair in metadata if pair[0] not in keys) + pairs


def broken(live: Iterable[int]) -> List[Action]:
    """(In an exception handler.) What ends a call whose machine failed deciding an event (a bug), on a thread or
    loop callback where the exception would only be logged: its live attempts cancelled, the call ended
    INTERNAL (the driver's local details: INTERNAL_DETAILS)."""
    log.exception("grpc_retry: the call's machine failed")
    return [(CANCEL, n) for n in sorted(live)] + [(END, grpc.StatusCode.INTERNAL.value[0])]


def trailing_with_attempts(trailing: Optional[Sequence[Tuple[str, Any]]], previous: int) -> MetadataPairs:
    """The trailing metadata the application gets: the attempt's, plus how many attempts came before it."""
    return tuple(trailing or ()) + ((PREVIOUS_ATTEMPTS, str(previous)),)


def local_status(code: int, details: str, subchannels: Any, machine: CallMachine) -> Tuple[grpc.StatusCode, str]:
    """A status no server sent, as grpcio words it: an injected fault's abort, the deadline, no backend to take
    the call, the last attempt's perAttemptRecvTimeout, or the cancel or local failure whose details the driver
    gives."""
    status = STATUS_CODES[code]
    if machine.reason_name == "fault_injected":
        return status, FAULT_DETAILS
    if status is grpc.StatusCode.DEADLINE_EXCEEDED:
        return status, DEADLINE_DETAILS
    if machine.recv_timeout_ended:
        return status, RECV_TIMEOUT_DETAILS
    if status is grpc.StatusCode.UNAVAILABLE:
        return status, subchannels.unavailable_details()
    return status, details


_STREAM_REMOVED = "Stream removed ("
_LOCAL_ENDS = ("Stream removed (Deadline Exceeded)", "Stream removed (Channel closed!)")


def grpc_details(details: Optional[str], answered: bool, subchannels: Any = None) -> Optional[str]:
    """An attempt's status details as grpcio's own channel words them. Subchannels run with C-core's retries off;
    a grpcio channel has them on, and its retry layer reports a call ended locally (deadline, channel closed)
    before the server answered with the cause alone, where the transport says "Stream removed (<cause>)". An
    attempt that found no connection on its subchannel (pick_first's words) fails as the channel's LB policy
    (`subchannels`) words it."""
    if not answered and details in _LOCAL_ENDS:
        return details[len(_STREAM_REMOVED):-1]
    if subchannels is not None and details:
        words: str = subchannels.failing_details(details)
        return words
    return details


class CallDriver:
    """Performs the machine's actions in order. The handlers are the driver's I/O. Keeps what every attempt of
    the call is started with."""

    __slots__ = ("_machine", "_method", "_request", "_metadata", "_credentials", "_compression", "_grpc_wfr", "_obs")

    def _init_driver(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any,
                     credentials: Any, wait_for_ready: Optional[bool], compression: Any, stream_request: bool) -> None:
        """What every driver's constructor does first, as a C call (a chain of super().__init__() would be Python
        calls, the arguments packed and parsed again at each level)."""
        self._machine = machine
        self._method = method  # the channel's method (_method.Method): inner(address), subchannels, ...
        self._request = request
        self._metadata = tuple(metadata) if metadata else ()
        self._credentials = credentials
        self._compression = compression
        # grpc_retry waits for ready itself where it can replay the attempt; grpcio waits where it cannot.
        self._grpc_wfr = bool(wait_for_ready) and (
            not machine.transparent_enabled or (stream_request and machine.committed))
        self._obs: Optional[CallTelemetry] = method.observe(machine)  # None: nothing exported for this call

    def _attempt_metadata(self, n: int, previous: int) -> MetadataPairs:
        """Attempt n's metadata: the call's, its previous-attempts count, and, with spans on, the trace context of
        the attempt's span (so that the server's span hangs under the attempt that reached it)."""
        metadata = attempt_metadata(self._metadata, previous)
        if self._obs is not None:
            wire = self._obs.wire_context(n)
            if wire and metadata:
                metadata = _replaced(metadata, wire)
            elif wire:
                metadata = wire
        return metadata

    def _act(self, actions: List[Action]) -> None:
        if self._obs is not None:
            self._obs.flush()  # what the machine decided to get these actions, exported first
        for action in actions:
            self._perform(action)

    def _perform(self, action: Action) -> None:
        kind = action[0]
        if kind == START:
            self._start(action[1], action[2], action[3])
        elif kind == WRITE:
            self._write(action[1], action[3])
        elif kind == HALF_CLOSE:
            self._half_close(action[1])
        elif kind == CANCEL:
            self._cancel_attempt(action[1])
        elif kind == COMMIT:
            self._commit(action[1])
        elif kind == TIMER:
            self._arm(action[1])
        elif kind == WAIT:
            self._wait(action[1])
        elif kind == UNWAIT:
            self._unwait()
        elif kind == DELIVER:
            self._deliver(action[1])
        elif kind == FLUSH:
            self._flush()
        else:
            self._end(action[1])

    def _start(self, n: int, address: int, previous: int) -> None:
        raise NotImplementedError

    def _write(self, n: int, data: bytes) -> None:
        raise NotImplementedError

    def _half_close(self, n: int) -> None:
        raise NotImplementedError

    def _cancel_attempt(self, n: int) -> None:
        raise NotImplementedError

    def _commit(self, n: int) -> None:
        raise NotImplementedError

    def _arm(self, at: float) -> None:
        raise NotImplementedError

    def _wait(self, generation: int) -> None:
        raise NotImplementedError

    def _unwait(self) -> None:
        raise NotImplementedError

    def _deliver(self, n: int) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        """Tell the inputs queued now (a timed call's timer is due: CallMachine.timer), then machine.flushed()."""
        raise NotImplementedError

    def _end(self, code: int) -> None:
        raise NotImplementedError

