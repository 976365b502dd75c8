"""The direct transport (grpc_retry/_transport): attempts on grpcio's Cython calls, their batches built by
grpc_retry, and every name the drivers and subchannels call on a transport. Its sync unary attempts are here;
its sync attempts with a stream in direct_streams.py, its asyncio attempts in direct_aio.py, and grpcio's
private names and state accessors in grpc_private.py.

| API     | unary response                                   | response stream             | request stream     |
|---------|--------------------------------------------------|-----------------------------|--------------------|
| sync    | grpcio's call, or one batch (sync_unary_start);  | SyncStreamAttempt: a batch  | grpcio's call,     |
|         | hedged or watched: SyncHeadersFirstAttempt       | per message read            | requests sent by a |
|         | (headers, then response and status)              |                             | worker thread      |
| asyncio | AioAttempt: one batch; hedged or watched, two    | AioAttempt: a batch per     | AioAttempt: a      |
|         | (headers, then response and status)              | message read                | batch per message  |
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Tuple

import grpc

from grpc_retry._transport.direct_aio import AioAttempts, aio_intercepted
from grpc_retry._transport.direct_streams import (
    SyncRequestStream,
    SyncResponseStream,
    sync_tells_headers,
    sync_wait_end,
    sync_wait_headers,
)
from grpc_retry._transport.ends import (
    AttemptState,
    SyncAttempt,
    grpcio_exchange,
    report_end,
    sync_code,
    sync_response,
    sync_status,
    tell,
)
from grpc_retry._transport.grpc_private import (
    CORE_ERROR,
    LOCALLY_CANCELLED,
    PROPAGATE_DEFAULTS,
    WAIT_FOR_READY,
    aio_working_loop,
    augmented_metadata,
    channelz_subchannels,
    close_sync_channel,
    determined,
    new_aio_channel,
    new_sync_channel,
    new_sync_channel_with_id,
    read_status,
    sync_calls_in_flight,
    sync_connectivity,
    sync_direct,
    sync_state_reader,
    sync_watch_connectivity,
    unary_ops,
)

_OK = grpc.StatusCode.OK

# A hedged sync unary attempt must show its response headers before its response, as the asyncio one: grpcio's
# unary-stream shape would need a worker thread blocked on each hedge until it answered, at several times a unary
# call's CPU.
# This one is two batches (the request with the headers, the response with the status) on a call grpcio's channel
# manages: its spin thread, which ends grpcio's own futures, hands each batch's event to the attempt.


class SyncEnded:
    """A sync attempt that has ended, made without a grpcio call object: its `_state` reads as one's would."""

    __slots__ = ("_state",)

    def __init__(self, state: AttemptState) -> None:
        self._state = state


def sync_unary_start(m: Any, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
                     wait_for_ready: Optional[bool], compression: Any) -> Tuple[Any, Tuple[Any, Any, Any]]:
    """A blocking unary-unary exchange on grpcio's sync multicallable `m` of a subchannel, started on its Cython
    call as grpcio's blocking call starts it (one batch), without the call state, event handling and rendezvous
    that grpcio's adds: the call and its receiving operations, for sync_unary_end(). Raises what grpcio raises for
    a call it cannot start."""
    sending, receiving = unary_ops(request, augmented_metadata(metadata, compression),
                                    WAIT_FOR_READY[wait_for_ready])
    deadline = determined(None if timeout is None else time.time() + timeout)
    call = m._channel.segregated_call(PROPAGATE_DEFAULTS, m._method, None, deadline, metadata,
                                      None if credentials is None else credentials._credentials,
                                      ((sending + receiving, None),), m._context, m._registered_call_handle)
    return call, receiving


def sync_unary_end(call: Any, receiving: Tuple[Any, Any, Any]) -> SyncEnded:
    """A started blocking unary-unary exchange, waited for on this thread as grpcio's blocking call waits."""
    call.next_event()
    headers, message, status = receiving
    state = AttemptState()
    state.initial_metadata = headers.initial_metadata()
    read_status(state, status)
    if state.code is _OK:
        state.response = message.message()
    return SyncEnded(state)


def sync_exchange(m: Any, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
                  wait_for_ready: Optional[bool], compression: Any, call_wanted: bool) -> Tuple[Any, Any, bool]:
    """A blocking unary-unary exchange on this thread (protocol.py): one batch on grpcio's Cython call where no
    call object is wanted and no observability plugin records grpcio's own calls; else grpcio's blocking call."""
    if call_wanted or not sync_direct():
        return grpcio_exchange(m, request, timeout, metadata, credentials, wait_for_ready, compression, call_wanted)
    call, receiving = sync_unary_start(m, request, timeout, metadata, credentials, wait_for_ready, compression)
    ended = sync_unary_end(call, receiving)
    if ended._state.code is _OK:
        return None, ended._state.response, True
    return ended, None, False


class SyncUnary:
    """An unhedged unary-unary method on one sync subchannel, made from grpcio's multicallable of it: it makes
    `SyncUnaryAttempt`s; grpcio's own futures while its observability plugin is registered (see sync_direct).
    `multicallable`: grpcio's, for an attempt made as one blocking call (sync_exchange)."""

    __slots__ = ("multicallable",)

    def __init__(self, multicallable: Any) -> None:
        self.multicallable = multicallable

    def __call__(self, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None) -> Any:
        """A non-blocking attempt that tells its end to `on_end` (and nothing to `on_headers`)."""
        if sync_direct():
            return SyncUnaryAttempt(self.multicallable, request, timeout=timeout, metadata=metadata,
                                    credentials=credentials, wait_for_ready=wait_for_ready, compression=compression,
                                    on_end=on_end)
        return report_end(self.multicallable.future(
            request, timeout=timeout, metadata=metadata, credentials=credentials, wait_for_ready=wait_for_ready,
            compression=compression), on_end)


class SyncHeadersFirst:
    """A unary-unary method on one sync subchannel, made from grpcio's multicallable of it: it makes
    `SyncHeadersFirstAttempt`s. `multicallable`: grpcio's, for an attempt made as one blocking call."""

    __slots__ = ("multicallable",)

    def __init__(self, multicallable: Any) -> None:
        self.multicallable = multicallable

    def __call__(self, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None, pollable: bool = False) -> SyncHeadersFirstAttempt:
        """`pollable`: a thread of the application's, free to wait, polls the attempt (it is `polled`), however
        many calls overlap: grpcio's spin thread, taking every call's events, would cost each of them grpcio's
        managed-call path (a context manager to start it, a Python loop turn per event) and a hand-off to the
        waiting caller. Each caller taking its own events counted fewer instructions (callgrind, 16 in flight) and
        the same time within the spread."""
        deadline = None if timeout is None else time.time() + timeout
        return self._attempt(request, determined(deadline) if pollable else deadline, metadata, credentials,
                             wait_for_ready, compression, on_headers, on_end, pollable, False)

    def polled(self, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
               wait_for_ready: Optional[bool], compression: Any, on_headers: Callable[[Any], None],
               on_end: Callable[[Any], None], whole: bool) -> SyncHeadersFirstAttempt:
        """The attempt as called with `pollable` (a blocking hedged call's first), its arguments in order: no
        keywords to gather and parse on each call's path. `whole`: as one batch (Method.first_whole)."""
        return self._attempt(request, determined(None if timeout is None else time.time() + timeout), metadata,
                             credentials, wait_for_ready, compression, on_headers, on_end, True, whole)

    def _attempt(self, request: bytes, deadline: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_headers: Optional[Callable[[Any], None]],
                 on_end: Callable[[Any], None], polled: bool, whole: bool) -> SyncHeadersFirstAttempt:
        return SyncHeadersFirstAttempt(
            self.multicallable, request, deadline, metadata, augmented_metadata(metadata, compression),
            WAIT_FOR_READY[wait_for_ready], None if credentials is None else credentials._credentials, on_headers,
            on_end, polled, whole)


class _UnaryAttempt(SyncAttempt):
    """A sync unary-unary attempt on grpcio's Cython call: its end read into its state, then told to `on_end(self)`
    (and nothing more to `on_headers`)."""

    __slots__ = ("_call", "_ops", "_lock", "on_headers", "on_end")
    _call: Any  # grpcio's call, made by the subclass once the rest is in place (its events may come at once)

    def _init_unary(self, receiving: Tuple[Any, ...], on_end: Callable[[Any], None]) -> None:
        """What its subclasses' constructors do first, as a C call (super().__init__() would be a Python call)."""
        self._state = AttemptState()
        self._lock = threading.Lock()
        self._ops: Tuple[Any, ...] = receiving  # () once ended
        self.on_headers: Optional[Callable[[Any], None]] = None
        self.on_end: Optional[Callable[[Any], None]] = on_end

    def _end(self, success: bool) -> None:
        state = self._state
        lock = self._lock
        lock.acquire()  # (not `with`: compiled, each `with` binds two of the lock's methods and makes a tuple)
        try:
            if state.code is None:  # not cancelled meanwhile
                headers, message, status = self._ops
                if state.initial_metadata is None:
                    state.initial_metadata = headers.initial_metadata() if success else ()
                if success:
                    read_status(state, status)
                    if state.code is _OK:
                        state.response = message.message()
                else:
                    state.code, state.details = grpc.StatusCode.INTERNAL, CORE_ERROR
            self._ops = ()
            on_end, self.on_headers, self.on_end = self.on_end, None, None
        finally:
            lock.release()
        if on_end is not None:
            tell(on_end, self)

    def cancel(self) -> bool:
        state = self._state
        with self._lock:
            if state.code is not None:
                return False
            state.code, state.details = grpc.StatusCode.CANCELLED, LOCALLY_CANCELLED
            if state.initial_metadata is None:
                state.initial_metadata = ()
        self._call.cancel(1, LOCALLY_CANCELLED)  # its batches end, and it tells
        return True


class SyncUnaryAttempt(_UnaryAttempt):
    """One attempt of a non-blocking, unhedged sync unary-unary call (a future): the one batch grpcio's future()
    starts, on a call its channel manages, without grpcio's call state, event handler and rendezvous around it; it
    calls `on_end(self)` from grpcio's spin thread once it has ended. Raises as it is made what grpcio raises for a
    call it cannot start."""

    __slots__ = ()

    def __init__(self, m: Any, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None]) -> None:
        sending, receiving = unary_ops(request, augmented_metadata(metadata, compression),
                                        WAIT_FOR_READY[wait_for_ready])
        self._init_unary(receiving, on_end)
        self._call = m._managed_call(PROPAGATE_DEFAULTS, m._method, None,
                                     None if timeout is None else time.time() + timeout, metadata,
                                     None if credentials is None else credentials._credentials,
                                     (sending + receiving,), self._on_event, m._context, m._registered_call_handle)

    def _on_event(self, event: Any) -> bool:
        """grpcio's spin thread: the batch is done, and so is the call."""
        self._end(bool(event.success))
        return True


class SyncHeadersFirstAttempt(_UnaryAttempt):
    """One attempt of a hedged sync unary call. It calls `on_headers(self)` when its response headers came
    (unless its end came with them), then `on_end(self)` once it has ended: from grpcio's spin thread (never
    blocking it), or, if `polled`, from the thread that calls poll() — the blocking call's caller, as grpcio's
    blocking call waits on its own call's queue: no spin thread to start per call, no hand-off. `whole` (polled
    only): one batch, as a blocking unary call's, whose headers show with its end (only `on_end` is told)."""

    __slots__ = ("_end_waits", "polled")

    def __init__(self, m: Any, request: bytes, deadline: Optional[float], metadata: Any, augmented: Any, flags: int,
                 credentials: Any, on_headers: Optional[Callable[[Any], None]], on_end: Callable[[Any], None],
                 polled: bool = False, whole: bool = False) -> None:
        sending, receiving = unary_ops(request, augmented, flags)
        self._init_unary(receiving, on_end)
        self.polled = polled
        # The end's batch came first: whether it succeeded (one batch: no headers' batch to wait for)
        self._end_waits: Optional[bool] = False if whole else None
        self.on_headers = on_headers
        headers, message, status = receiving
        # The request's batch first: grpcio starts them one after the other, and the request's is the one that
        # can fail to start (metadata C-core refuses), which must leave no batch of this call behind. (Its events
        # may come before this returns: only cancel() uses `_call`.)
        request_batch, response_batch = sending + (headers,), (message, status)
        if whole:
            self._call = m._channel.segregated_call(PROPAGATE_DEFAULTS, m._method, None, deadline, metadata,
                                                    credentials, ((sending + receiving, None),), m._context,
                                                    m._registered_call_handle)
        elif polled:
            self._call = m._channel.segregated_call(PROPAGATE_DEFAULTS, m._method, None, deadline, metadata,
                                                    credentials, ((request_batch, None), (response_batch, None)),
                                                    m._context, m._registered_call_handle)
        else:
            self._call = m._managed_call(PROPAGATE_DEFAULTS, m._method, None, deadline, metadata, credentials,
                                         (request_batch, response_batch), self._on_event, m._context,
                                         m._registered_call_handle)

    def poll(self) -> None:
        """(A polled attempt; one thread, which may block.) Until it has ended, take its events off its call's own
        queue and report them, on this thread. Interrupted (a signal's exception), grpcio has dropped the call:
        the attempt ends CANCELLED, and tells, before the exception goes on."""
        call = self._call
        try:
            while not self._on_event(call.next_event()):
                pass
        except BaseException:
            self.cancel()  # (grpcio's call has no batch left to cancel)
            self._end(False)
            raise

    def _on_event(self, event: Any) -> bool:
        """grpcio's spin thread (or the poller): a batch is done. True once every one is (grpcio then stops counting
        the call)."""
        state = self._state
        lock = self._lock
        if len(event.batch_operations) == 4:  # the request and the headers (one batch: all six, as the end's)
            lock.acquire()
            try:
                told = state.code is None and bool(event.success)  # else cancelled, or failed: the end tells
                if told:
                    state.initial_metadata = self._ops[0].initial_metadata()
                end, self._end_waits = self._end_waits, False
            finally:
                lock.release()
            on_headers = self.on_headers
            if told and on_headers is not None and (state.initial_metadata or end is None):
                tell(on_headers, self)
            if end is not None:
                self._end(end)
            return end is not None
        lock.acquire()
        try:
            if self._end_waits is None:  # the headers' batch is yet to come: the end waits for it
                self._end_waits = bool(event.success)
                return False
        finally:
            lock.release()
        self._end(bool(event.success))
        return True


# A sync attempt with a response stream (unary request): the batches grpcio's unary-stream call starts, on a call
# its channel manages, without grpcio's response iterator around them (its call state, a closure per event, and a
# timed condition wait per message). Messages are read one batch at a time on the reader's demand, as grpcio
# reads them.


# -- the attempt makers (grpc_retry/_transport/__init__.py: shape() and method()) -------------------------------

class SyncAttempts:
    """Sync attempts on grpcio's Cython calls where they pay: a hedged unary-unary call's attempts show their
    headers first (SyncHeadersFirst), a unary-stream call's are read a batch per message (SyncResponseStream), an
    unhedged unary-unary call's are one batch (SyncUnary); a request stream's are grpcio's own calls, their requests
    sent by a worker of the channel's (SyncRequestStream)."""

    watch_spacing = 1  # (headers first costs a second batch)

    @staticmethod
    def shape(kind: str, hedged: bool) -> Tuple[str, bool, bool]:
        return kind, False, hedged and kind == "unary_unary"

    @staticmethod
    def method(channel: Any, name: str, shape: Tuple[str, bool, bool], owner: Any) -> Any:
        kind = shape[0]
        multicallable = getattr(channel, kind)(name)
        if shape[2]:
            return SyncHeadersFirst(multicallable)
        if kind == "unary_unary":
            return SyncUnary(multicallable)
        if kind == "unary_stream":
            return SyncResponseStream(multicallable)
        return SyncRequestStream(multicallable, kind == "stream_stream", owner.workers)


FINAL_WRAPPED = False  # an attempt of this transport is a grpc.Call the application may get as it is


def sync_final(call: Any, response: Any) -> Any:
    """The grpc.Call the application gets of a successful sync attempt whose deserialized result is `response`:
    the attempt itself, its result() then that response (its attempts carry bytes)."""
    call._state.response = response
    return call


SYNC = SyncAttempts()
AIO = AioAttempts()

# What the drivers and subchannels call on a transport (portable.py has the same names).
__all__ = [
    "AIO", "FINAL_WRAPPED", "SYNC", "aio_intercepted", "aio_working_loop", "channelz_subchannels",
    "close_sync_channel", "new_aio_channel", "new_sync_channel", "new_sync_channel_with_id", "sync_calls_in_flight",
    "sync_code", "sync_connectivity", "sync_exchange", "sync_final", "sync_response", "sync_state_reader",
    "sync_status", "sync_tells_headers", "sync_wait_end", "sync_wait_headers", "sync_watch_connectivity",
]
