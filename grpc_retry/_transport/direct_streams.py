"""The direct transport's sync attempts with a stream: a request stream on grpcio's own call, its requests sent
from a worker thread of grpc_retry's channel (grpcio starts and ends a thread per call); a response stream on
grpcio's Cython call, read a batch per message."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any, Callable, Iterator, Optional, Tuple, cast

import grpc
from grpc._cython import cygrpc

from grpc_retry._transport.ends import Metadata, SyncAttempt, decode, report_end, tell
from grpc_retry._transport.grpc_private import (
    LOCALLY_CANCELLED,
    NO_FLAGS,
    PROPAGATE_DEFAULTS,
    SEND_CLOSE,
    SEND_MESSAGE,
    WAIT_FOR_READY,
    ReceiveInitialMetadataOperation,
    ReceiveMessageOperation,
    ReceiveStatusOnClientOperation,
    SendCloseFromClientOperation,
    SendInitialMetadataOperation,
    SendMessageOperation,
    augmented_metadata,
    determined,
    read_status,
    sync_direct,
)
from grpc_retry._waiters import Waiters

try:
    from grpc import _channel
except ImportError:
    _channel = None  # type: ignore[assignment]

_BYTES: Any = None  # grpcio's "serializer" of requests that are bytes already


class SyncRequestStream:
    """A stream-unary or stream-stream method on one sync subchannel, made from grpcio's multicallable of it: its
    attempts are grpcio's own calls, their requests sent from a worker thread of grpc_retry's channel (grpcio
    starts and ends a thread per call); grpcio's own calls as they are while its observability plugin is
    registered (see sync_direct)."""

    __slots__ = ("multicallable", "_response_stream", "_workers")

    def __init__(self, multicallable: Any, response_stream: bool, workers: Any) -> None:
        self.multicallable = multicallable
        self._response_stream = response_stream
        self._workers = workers

    def __call__(self, requests: Iterator[bytes], *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None) -> Any:
        """A non-blocking attempt that tells its end to `on_end` (and nothing to `on_headers`)."""
        m = self.multicallable
        if sync_direct():
            call = sync_request_stream(m, requests, self._workers, self._response_stream, timeout=timeout,
                                       metadata=metadata, credentials=credentials, wait_for_ready=wait_for_ready,
                                       compression=compression)
        else:
            call = (m if self._response_stream else m.future)(
                requests, timeout=timeout, metadata=metadata, credentials=credentials, wait_for_ready=wait_for_ready,
                compression=compression)
        return report_end(call, on_end)

    def blocking(self, requests: Iterator[bytes], *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> Any:
        """(Stream-unary.) A blocking attempt, run() on the caller's thread and cancellable from another."""
        if sync_direct():
            return SyncBlockingRequestStream(self.multicallable, requests, timeout=timeout, metadata=metadata,
                                             credentials=credentials, wait_for_ready=wait_for_ready,
                                             compression=compression)
        return _BlockingFuture(self.multicallable.future(
            requests, timeout=timeout, metadata=metadata, credentials=credentials, wait_for_ready=wait_for_ready,
            compression=compression))


class _BlockingFuture:
    """A blocking stream-unary attempt as grpcio's own future, waited for by the caller's thread."""

    __slots__ = ("_call",)

    def __init__(self, call: Any) -> None:
        self._call = call

    def run(self, workers: Any) -> grpc.Call:
        """(The caller's thread.) Until it has ended; then grpcio's call. Interrupted (a signal's exception), the
        call is cancelled before the exception goes on."""
        call = self._call
        try:
            call.exception()
        except grpc.FutureCancelledError:
            pass
        except BaseException:
            call.cancel()
            raise
        return cast(grpc.Call, call)

    def cancel(self) -> bool:
        return bool(self._call.cancel())


class SyncBlockingRequestStream:
    """A blocking stream-unary attempt: grpcio's blocking stream-unary call (a call of its own queue, whose events
    run() takes on the caller's thread), made here so that the driver can cancel it from another thread. Its
    requests are sent, one at a time as grpcio sends them, by a worker thread of the channel's (a thread kept
    for the next attempt, where grpcio starts and ends a thread per call: ~a fifth of its CPU a call, one call at
    a time) — or by grpcio's own thread where grpcio's fork support is on (its threads are counted for a fork).
    Its `_state` is grpcio's call state. Raises as it is made what grpcio raises for a call it cannot start."""

    __slots__ = ("_state", "_call", "_requests")

    def __init__(self, m: Any, requests: Iterator[bytes], *, timeout: Optional[float], metadata: Any,
                 credentials: Any, wait_for_ready: Optional[bool], compression: Any) -> None:
        state = self._state = _channel._RPCState(_channel._STREAM_UNARY_INITIAL_DUE, None, None, None, None)
        state.rpc_start_time = time.perf_counter()  # what grpcio's event handling reads, as its own call sets it
        state.method, state.target = decode(m._method), decode(m._target)
        augmented = augmented_metadata(metadata, compression)
        self._requests = requests
        deadline = None if timeout is None else time.time() + timeout
        self._call = m._channel.segregated_call(
            PROPAGATE_DEFAULTS, m._method, None, determined(deadline), augmented,
            None if credentials is None else credentials._credentials,
            _channel._stream_unary_invocation_operations_and_tags(augmented, WAIT_FOR_READY[wait_for_ready]),
            m._context, m._registered_call_handle)

    def run(self, workers: Any) -> grpc.Call:
        """(The caller's thread.) Until it has ended, as grpcio's blocking call waits; then the call grpcio's
        with_call() would give (its state is the attempt's). `workers`: where its requests are sent from."""
        state, call = self._state, self._call
        _send_from(workers, self._requests, state, call, None)
        while True:
            event = call.next_event()
            with state.condition:
                _channel._handle_event(event, state, None)
                state.condition.notify_all()
                if not state.due:  # (no deadline: grpcio's with_call() call has no time remaining)
                    return cast(grpc.Call, _channel._MultiThreadedRendezvous(state, call, None, None))

    def cancel(self) -> bool:
        with self._state.condition:
            if self._state.code is not None:
                return False
        self._call.cancel(cygrpc.StatusCode.cancelled, LOCALLY_CANCELLED)  # its batches end: run() returns
        return True


def sync_request_stream(m: Any, requests: Iterator[bytes], workers: Any, response_stream: bool, *,
                        timeout: Optional[float], metadata: Any, credentials: Any, wait_for_ready: Optional[bool],
                        compression: Any) -> grpc.Call:
    """A non-blocking attempt with a request stream: grpcio's own call, as its stream-stream `__call__` or its
    stream-unary `future()` makes it (its call object, its events taken by the channel's spin thread), with its
    requests sent from a worker thread of grpc_retry's channel (see SyncBlockingRequestStream) instead of a thread
    grpcio starts and ends for each call."""
    deadline = None if timeout is None else time.time() + timeout
    augmented = augmented_metadata(metadata, compression)
    flags = WAIT_FOR_READY[wait_for_ready]
    if response_stream:
        state = _channel._RPCState(_channel._STREAM_STREAM_INITIAL_DUE, None, None, None, None)
        operations: Any = ((SendInitialMetadataOperation(augmented, flags),
                            ReceiveStatusOnClientOperation(NO_FLAGS)),
                           (ReceiveInitialMetadataOperation(NO_FLAGS),))
    else:
        state = _channel._RPCState(_channel._STREAM_UNARY_INITIAL_DUE, None, None, None, None)
        # (grpcio's future() sends the metadata as given, not the compression's augmented one: so does this)
        operations = _channel._stream_unary_invocation_operations(metadata, flags)
    on_event = _channel._event_handler(state, None)
    state.rpc_start_time = time.perf_counter()  # what grpcio's event handling reads, as its own call sets it
    state.method, state.target = decode(m._method), decode(m._target)
    call = m._managed_call(PROPAGATE_DEFAULTS, m._method, None, determined(deadline), augmented,
                           None if credentials is None else credentials._credentials, operations, on_event,
                           m._context, m._registered_call_handle)
    _send_from(workers, requests, state, call, on_event)
    return cast(grpc.Call, _channel._MultiThreadedRendezvous(state, call, None, deadline))


def _send_from(workers: Any, requests: Iterator[bytes], state: Any, call: Any, tag: Any) -> None:
    """An attempt's requests sent from one of `workers` (grpcio's own thread where its fork support is on: its
    threads are counted for a fork; or where the channel has closed meanwhile: its close ends the attempt)."""
    if not cygrpc.is_fork_support_enabled():
        try:
            # (In a context of its own, as a new thread's: nothing of one call's iterator is seen by the next.)
            workers.submit(contextvars.Context().run, _send_requests, requests, state, call, tag)
            return
        except RuntimeError:  # the workers closed with their channel
            pass
    _channel._consume_request_iterator(requests, state, call, _BYTES, tag)


def _send_requests(requests: Iterator[bytes], state: Any, call: Any, tag: Any) -> None:
    """(A worker thread.) Each message of an attempt, sent once the one before it has gone (its completion is seen
    by the thread taking the call's events — the blocking call's caller, or the spin thread, through `tag` —
    which wakes this one), then the half-close; until the attempt ends. `requests` does not raise: the driver
    ends the call itself when the application's iterator or serializer fails."""
    condition, due = state.condition, state.due
    for data in requests:
        with condition:
            if state.code is not None or state.cancelled:
                return
            due.add(SEND_MESSAGE)
            if not call.operate((SendMessageOperation(data, NO_FLAGS),), tag):
                due.discard(SEND_MESSAGE)  # the call is over
                return
            while SEND_MESSAGE in due and state.code is None:
                condition.wait(0.1)
            if state.code is not None:
                return
    with condition:
        if state.code is None and not state.cancelled:
            due.add(SEND_CLOSE)
            if not call.operate((SendCloseFromClientOperation(NO_FLAGS),), tag):
                due.discard(SEND_CLOSE)


class SyncResponseStream:
    """A unary-stream method on one sync subchannel, made from grpcio's multicallable of it: it makes
    `SyncStreamAttempt`s; grpcio's own calls while its observability plugin is registered (see sync_direct)."""

    __slots__ = ("multicallable",)

    def __init__(self, multicallable: Any) -> None:
        self.multicallable = multicallable

    def __call__(self, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None) -> Any:
        """An attempt that tells its end to `on_end`, and its headers to `on_headers` when it is a
        SyncStreamAttempt (sync_tells_headers): grpcio's own call tells neither."""
        m = self.multicallable
        if not sync_direct():
            return report_end(m(request, timeout=timeout, metadata=metadata, credentials=credentials,
                                wait_for_ready=wait_for_ready, compression=compression), on_end)
        return SyncStreamAttempt(
            m, request, determined(None if timeout is None else time.time() + timeout), metadata,
            augmented_metadata(metadata, compression), WAIT_FOR_READY[wait_for_ready],
            None if credentials is None else credentials._credentials, on_end, on_headers)


class SyncStreamAttempt(SyncAttempt):
    """One attempt with a response stream. `next()` reads its next message (StopIteration once it has ended: its
    status then says how), `wait_headers()` and `wait_end()` block for what they name (never call them on
    grpcio's own thread). It calls `on_end(self)` once it has ended (status and headers in), from grpcio's spin
    thread, or from a thread waiting in next() for that end: the reader then hears it without waiting for
    grpcio's thread to tell it. With `on_headers`, it calls `on_headers(self)` from the spin thread when its
    headers came ahead of its end (a timed attempt's headers stop its timer: no thread waits for them)."""

    __slots__ = ("_call", "_lock", "_messages", "_others", "_due", "_reading", "_readers", "_message",
                 "_headers_due", "_status_due", "_status", "on_end", "on_headers")

    def __init__(self, m: Any, request: bytes, deadline: Optional[float], metadata: Any, augmented: Any, flags: int,
                 credentials: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._messages = Waiters(self._lock)  # readers: a message came, or the end
        self._others = Waiters(self._lock)  # waiting for the headers or the end
        self._due = 2  # batches started and not yet done
        self._reading = False  # a message's batch is started
        self._readers = 0  # threads waiting in next()
        self._message: Optional[bytes] = None  # read, not yet taken
        self._headers_due = self._status_due = True
        self.on_end: Optional[Callable[[Any], None]] = on_end
        self.on_headers = on_headers
        headers = ReceiveInitialMetadataOperation(NO_FLAGS)
        self._status = ReceiveStatusOnClientOperation(NO_FLAGS)
        # As grpcio's: the request's batch (which can fail to start, and then leaves no batch behind) first.
        self._call = m._managed_call(
            PROPAGATE_DEFAULTS, m._method, None, deadline, metadata, credentials,
            ((SendInitialMetadataOperation(augmented, flags), SendMessageOperation(request, NO_FLAGS),
              SendCloseFromClientOperation(NO_FLAGS), self._status), (headers,)),
            self._on_event, m._context, m._registered_call_handle)

    def _on_event(self, event: Any) -> bool:
        """grpcio's spin thread: the request's batch (which ends with the status) or the headers' is done. True
        once no batch of the call is left (grpcio then stops counting it)."""
        state = self._state
        on_end = on_headers = None
        with self._lock:
            self._due -= 1
            operations = event.batch_operations
            if len(operations) == 1:
                self._headers_due = False
                state.initial_metadata = operations[0].initial_metadata()  # as grpcio's, even once cancelled
                if self._status_due and state.code is None:  # (else the end tells: a waiter sees it ended)
                    on_headers = self.on_headers
                self.on_headers = None
            else:
                self._status_due = False
                if state.code is None:
                    read_status(state, self._status)
                else:  # cancelled meanwhile
                    state.trailing_metadata = tuple(self._status.trailing_metadata() or ())
                self._messages.notify_all()
            # A reader waiting with nothing left to read wakes to this end, and tells it.
            if not (self._readers and self._message is None and not self._reading):
                on_end = self._take_end()
            self._others.notify_all()
            done = self._due == 0
        if on_headers is not None:
            tell(on_headers, self)
        if on_end is not None:
            tell(on_end, self)
        return done

    def _take_end(self) -> Optional[Callable[[Any], None]]:
        """(Under the lock.) on_end, once, if the attempt has ended with its headers and status in."""
        if self._headers_due or self._status_due:
            return None
        on_end, self.on_end = self.on_end, None
        return on_end

    def _on_message(self, event: Any) -> bool:
        with self._lock:
            self._due -= 1
            self._reading = False
            self._message = event.batch_operations[0].message()  # None at the stream's end
            self._messages.notify_all()
            return self._due == 0

    def __next__(self) -> bytes:
        state = self._state
        on_end = None
        try:
            with self._lock:
                if state.code is None and not self._reading:  # as grpcio's: once the status is in, no more reads
                    self._due += 1
                    if self._call.operate((ReceiveMessageOperation(NO_FLAGS),), self._on_message):
                        self._reading = True
                    else:
                        self._due -= 1
                while True:
                    message = self._message
                    if message is not None:
                        self._message = None
                        return message
                    if not self._reading and state.code is not None:
                        if on_end is None:
                            on_end = self._take_end()
                        break
                    self._readers += 1
                    try:
                        self._messages.wait()
                    finally:
                        self._readers -= 1
                        if on_end is None and not self._readers and self._message is None and not self._reading:
                            on_end = self._take_end()  # if it was left to the readers (this one may be interrupted)
        finally:
            if on_end is not None:
                tell(on_end, self)
        raise StopIteration()

    def wait_headers(self) -> Tuple[Metadata, bool]:
        """As sync_wait_headers."""
        state = self._state
        with self._lock:
            while state.initial_metadata is None and state.code is None:
                self._others.wait()
            return tuple(state.initial_metadata or ()), state.code is not None

    def wait_end(self) -> None:
        state = self._state
        with self._lock:
            while state.code is None:
                self._others.wait()

    def cancel(self) -> bool:
        state = self._state
        with self._lock:
            if state.code is not None:
                return False
            state.code, state.details, state.trailing_metadata = grpc.StatusCode.CANCELLED, LOCALLY_CANCELLED, ()
            if state.initial_metadata is None:
                state.initial_metadata = ()
            self._messages.notify_all()
            self._others.notify_all()
        self._call.cancel(1, LOCALLY_CANCELLED)  # its batches end, and it tells
        return True


def sync_tells_headers(call: Any) -> bool:
    """Whether a sync attempt started with `on_headers` tells its headers to it."""
    return type(call) is SyncStreamAttempt


def sync_wait_headers(call: Any) -> Tuple[Metadata, bool]:
    """Block (never on grpcio's own thread) until a sync attempt has its response headers or has ended:
    (the headers so far, whether it has ended)."""
    if type(call) is SyncStreamAttempt:
        return call.wait_headers()
    state = call._state
    with state.condition:
        while state.initial_metadata is None and state.code is None:
            state.condition.wait()
        return tuple(state.initial_metadata or ()), state.code is not None


def sync_wait_end(call: Any) -> None:
    if type(call) is SyncStreamAttempt:
        call.wait_end()
        return
    state = call._state
    with state.condition:
        while state.code is None:
            state.condition.wait()
