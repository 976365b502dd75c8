"""The sync call objects (Call, StreamingCall): grpc.Call and grpc.Future over the call's driver
(sync/_driver.py, sync/_caller.py), with what the application's threads do: read responses (and read ahead,
before an attempt has won), send the requests of a request stream, wait for the end. A blocking call runs on the
driver's own type (`_Future`), which its caller never sees."""

from __future__ import annotations

from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Tuple, cast

import grpc

from grpc_retry._transport import transport as internals

if TYPE_CHECKING:
    from grpc_retry._core import Action  # (kind, attempt, argument): an action the machine decided

from grpc_retry._driver import (
    CANCELLED_DETAILS,
    CLOSED_DETAILS,
    INF,
    log,
)
from grpc_retry._method import DESERIALIZE_FAILED, UNDESERIALIZABLE
from grpc_retry.sync._attempts import (
    ENDED,
    HALF_CLOSE,
    read_message,
)
from grpc_retry.sync._caller import _Caller
from grpc_retry.sync._status import RpcError, traceback_of

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED


class _Future(_Caller):
    """What the application's threads do with a non-blocking call (an extension type, sync/_call.pxd): read its
    responses, pull the requests of a request stream, wait for its end; and grpc.Future's and grpc.Call's
    methods."""

    def _reading(self, peeked: bool = False) -> Tuple[int, Any]:
        """(Under the lock.) The attempt to read: the winner, or (not hedged) the attempt in flight; waits for one
        to start. (-1, None) once the call has ended, or (`peeked`) once the winner's first message is in `_peek`
        and the winner is no longer in flight. (None is in flight as such while a watcher waits for each
        attempt's first answer: hedges, and timed attempts that do not tell their headers.)"""
        while True:
            winner = self._machine.winner
            n = winner if winner >= 0 else self._current
            call = self._attempts.get(n)
            if call is not None and (not self._reads or n not in self._reads):
                return n, call
            if call is None and (self._finished or peeked and n >= 0 and self._peek is not None
                                 and self._peek[0] == n):
                return -1, None
            self._changed.wait()

    def _next_message(self) -> Any:
        """A response stream's next response (StreamingCall's __next__; here, on the compiled base, `self` is
        typed: its fields are C fields, not looked up by name)."""
        while True:
            with self._lock:
                n, call = self._reading(True)
                peek = self._peek
                if peek is not None and peek[0] == self._machine.winner:
                    # The winner's first message, read before it won: first, even once the attempt has ended (its
                    # status may be in before the application reads).
                    self._peek = None
                    committed = True
                else:
                    peek = None
                    committed = n == self._machine.winner
            if peek is not None:
                message = peek[1]
            elif call is None:  # the call ended
                if self._error is not None:
                    raise self._error
                raise StopIteration()
            else:
                message = read_message(call) if committed else self._read_first(n, call, keep=False)
            if message is not ENDED:
                response = self._method.deserialize(message)
                if response is UNDESERIALIZABLE:
                    self._fail(grpc.StatusCode.INTERNAL, DESERIALIZE_FAILED)
                    raise cast(RpcError, self._error)
                self._delivered = True
                return response
            with self._lock:
                self._until_told(n)

    def _until_told(self, n: int) -> None:
        """(Under the lock.) Attempt n ended: wait until the machine has its status (grpcio's callback brings
        it) and has retried or ended the call."""
        while n in self._live and not self._finished:
            self._changed.wait()

    # -- reading ahead: an attempt's first answer, before it has won ---------------------------------------------

    def _watch(self, n: int, call: Any) -> None:
        """A hedge, on the watch pool: report its first answer (headers, or a message), which commits the call;
        a unary response's winner then reads its response, and reports its end."""
        try:
            message = self._first_answer(n, call)
            if self._method.unary_response:
                if self._method.attempt_streams:  # a unary call in the shape that shows its headers first
                    with self._lock:
                        read = self._machine.winner == n and n in self._live
                    if read:
                        if message is None:
                            message = read_message(call)
                        if message is not ENDED:
                            with self._lock:
                                self._responses[n] = message
                internals.sync_wait_end(call)
                self._ended(n, call)
        except Exception:  # never let a watcher die silently: the call would hang
            log.exception("grpc_retry hedge watcher failed")
            self._fail(grpc.StatusCode.INTERNAL, "grpc_retry hedge watcher failed")

    def _first_answer(self, n: int, call: Any) -> Any:
        """Block until attempt n answers or ends; tell the machine when it answers. Returns the first message if
        this read it (None if not)."""
        metadata, ended = internals.sync_wait_headers(call)
        with self._lock:
            if ended or self._machine.winner == n or n not in self._live:
                return None
        self._event(lambda: self._machine.headers(n, monotonic(), not metadata), n)
        if metadata:
            return None
        # Empty headers (the machine judges the silence after them): read ahead, as a message commits the call.
        message = self._read_first(n, call, keep=True)
        return None if message is ENDED else message

    def _read_first(self, n: int, call: Any, keep: bool) -> Any:
        """Read attempt n's first message before it has won (other readers of n, and its end if that comes
        meanwhile, wait for this read). A message commits the call to n; `keep`: for the application's first
        read. Returns the message, or ENDED when the attempt ended."""
        with self._lock:
            self._reads.add(n)
        message = ENDED
        try:
            if self._method.attempt_streams:
                message = read_message(call)
            else:  # a stream-unary attempt: its response comes with its end
                internals.sync_wait_end(call)
        finally:
            with self._lock:
                self._reads.discard(n)
                self._changed.notify_all()
                actions = []
                if message is not ENDED and not self._ending and n in self._live:
                    if keep:
                        self._peek = (n, message)
                    actions = self._answer(n)
                ended = self._deferred.pop(n, None)
                if ended is not None and not self._ending and n in self._live:
                    actions = actions + self._status(n, ended)
                taken = self._take(actions)
            if taken is not None:
                self._drain(taken)
        return message

    def _answer(self, n: int) -> List[Action]:
        """(Under the lock.) Attempt n, live, has its first message: the call is its own (if it was not already)."""
        return self._machine.message(n, monotonic()) if self._machine.winner != n else []


    # -- request streams ------------------------------------------------------------------------------------------


    def _attempt_requests(self, n: int) -> Iterator[Any]:
        """Attempt n's request iterator (consumed by grpcio's thread): what the machine writes to it. When it has
        nothing to send and the application's iterator has more, it pulls the next message for every attempt."""
        wrote = False
        while True:
            if wrote:
                self._event(lambda: self._machine.wrote(n, monotonic()), n)
            with self._lock:
                while True:
                    outbox = self._outboxes.get(n)
                    if outbox is None:
                        return
                    if outbox:
                        item = outbox.popleft()
                        break
                    if not self._pulling and not self._exhausted and self._machine.wants_message(n):
                        self._pulling = True
                        item = None
                        break
                    self._changed.wait()
            if item is None:
                self._pull()
                wrote = False
                continue
            if item is HALF_CLOSE:
                return
            wrote = True
            yield item

    def _pull(self) -> None:
        try:
            try:
                request = next(self._requests)
            except StopIteration:
                self._exhausted = True
                self._event(lambda: self._machine.half_close(monotonic()))
                return
            except Exception:
                log.exception("request iterator failed")
                self._exhausted = True
                self._fail(grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
                return
            try:
                data = request if self._serializer is None else self._serializer(request)
            except Exception:
                log.exception("request serializer failed")
                self._exhausted = True
                self._fail(grpc.StatusCode.INTERNAL, "Exception serializing request!")
                return
            self._event(lambda: self._machine.send_message(data, monotonic()))
        finally:
            with self._lock:
                self._pulling = False
                self._changed.notify_all()

    # -- ending ---------------------------------------------------------------------------------------------------


    def cancel(self) -> bool:
        return self._fail(grpc.StatusCode.CANCELLED, CANCELLED_DETAILS)

    def close_channel(self) -> None:
        """The channel is closing. With an attempt in flight, the subchannel's close ends that attempt, as
        grpcio's close ends its own calls; otherwise the call ends CANCELLED now."""
        with self._lock:
            if self._ending or self._live:
                return
        self._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)

    def closed(self, timeout: float) -> None:
        """After the subchannels' close: wait (at most `timeout`) for it to end the call's attempts, end the call
        if that did not (its last attempt may have failed just before, and the call gone into backoff), and wait
        for the end (performed by whichever thread is at the call's actions)."""
        deadline = monotonic() + timeout
        with self._lock:
            while self._live and not self._finished:
                left = deadline - monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        self._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
        self._wait_finished(max(0.0, deadline - monotonic()))

    # -- grpc.Future ----------------------------------------------------------------------------------------------

    def cancelled(self) -> bool:
        """Cancelled by the application, as grpcio says (a channel's close ends calls CANCELLED, not cancelled)."""
        error = self._error
        return error is not None and error.code() == grpc.StatusCode.CANCELLED and \
            error.details() == CANCELLED_DETAILS

    def running(self) -> bool:
        return not self._finished

    def done(self) -> bool:
        return self._finished

    def _wait_finished(self, timeout: Optional[float]) -> bool:
        """Until the call has ended, or `timeout` seconds: whether it has."""
        if self._finished:
            return True
        with self._lock:
            if timeout is None:
                while not self._finished:
                    self._changed.wait()
                return True
            deadline = monotonic() + timeout
            while not self._finished:
                left = deadline - monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def _until_done(self, timeout: Optional[float]) -> None:
        if not self._wait_finished(timeout):
            raise grpc.FutureTimeoutError()

    def result(self, timeout: Optional[float] = None) -> Any:
        self._until_done(timeout)
        if self._error is not None:
            if self.cancelled():
                raise grpc.FutureCancelledError()
            raise self._error
        return self._response

    def exception(self, timeout: Optional[float] = None) -> Optional[Exception]:
        self._until_done(timeout)
        if self.cancelled():
            raise grpc.FutureCancelledError()
        return self._error

    def traceback(self, timeout: Optional[float] = None) -> Any:
        error = self.exception(timeout)
        return None if error is None else traceback_of(error)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if not self._finished:
                if self._done_callbacks is None:
                    self._done_callbacks = []
                self._done_callbacks.append(fn)
                return
        fn(self)

    # -- grpc.Call ------------------------------------------------------------------------------------------------

    def is_active(self) -> bool:
        return not self._finished

    def time_remaining(self) -> Optional[float]:
        deadline = self._machine.deadline
        return None if deadline == INF else max(0.0, deadline - monotonic())

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if self._finished:
                return False
            if self._call_callbacks is None:
                self._call_callbacks = []
            self._call_callbacks.append(callback)
            return True

    def initial_metadata(self) -> Any:
        self._until_done(None)
        return self._error.initial_metadata() if self._error is not None else self._final.initial_metadata()

    def trailing_metadata(self) -> Any:
        self._until_done(None)
        return self._error.trailing_metadata() if self._error is not None else self._final.trailing_metadata()

    def code(self) -> grpc.StatusCode:
        self._until_done(None)
        return self._error.code() if self._error is not None else _OK

    def details(self) -> Any:
        self._until_done(None)
        return self._error.details() if self._error is not None else self._final.details()

    def debug_error_string(self) -> Optional[str]:
        self._until_done(None)
        return None if self._error is None else self._error.debug_error_string()


# (grpcio's Future is not generic; its time_remaining() is typed float where grpcio's calls return None too)
class Call(_Future, grpc.Call, grpc.Future):  # type: ignore[type-arg, misc]
    """A non-blocking call: grpc.Future and grpc.Call; a response stream adds the iterator (StreamingCall). (A
    blocking call runs on the driver's own type, which its caller never sees.)"""


class StreamingCall(Call):
    """A response stream: an iterator that is also a grpc.Call and a grpc.Future, as grpcio's. Once the call has
    committed, reads go straight to the winning attempt; before that, a reader reads ahead on the attempt in
    flight (not hedged), whose first message commits, or waits for a hedge to answer."""

    def __iter__(self) -> StreamingCall:
        return self

    __next__ = next = _Future._next_message

    def initial_metadata(self) -> Any:
        # As grpcio: as soon as the headers come. The application has then seen the attempt: it commits.
        while True:
            with self._lock:
                n, call = self._reading()
            if call is None:
                if self._error is not None:
                    return self._error.initial_metadata()
                return self._final.initial_metadata() if self._final is not None else ()
            if self._machine.winner != n:
                self._first_answer(n, call)
            if self._machine.winner == n:
                return internals.sync_wait_headers(call)[0]
            with self._lock:
                self._until_told(n)
