"""The portable transport: attempts and subchannels on grpcio's public API only (what every grpcio release keeps),
for a grpcio whose internals the direct transport does not know. The asyncio attempts are in portable_aio.py.

Sync: a non-blocking attempt is grpcio's own call (a future, or a response iterator) with `None` serializers. Its
end is read on a worker thread of the channel: grpcio tells a call's end on its own thread, where a public read of
the headers may wait for that very thread; a worker may wait. A hedged (or timed) unary attempt is read by a thread
that may wait: the blocking call's caller for its first attempt (polled), a worker for the others
(SyncHeadersFirst). Connectivity is followed with grpcio's subscribe(), a thread of grpcio's per subchannel.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional, Tuple

import grpc

from grpc_retry._transport.ends import AttemptState, tell
from grpc_retry._transport.ends import grpcio_exchange as sync_exchange
from grpc_retry._transport.portable_aio import WATCH_SPACING, AioAttempt, AioAttempts, aio_intercepted
from grpc_retry.sync._status import FinishedCall

Metadata = Tuple[Any, ...]

_OK = grpc.StatusCode.OK
_UNARY_RESPONSES = ("unary_unary", "stream_unary")
_DEBUG = '\tdebug_error_string = "'  # how an ended call's str() shows its debug error string


def _debug_error_string(call: Any) -> Optional[str]:
    """An ended call's debug error string, as its str() shows it: grpcio's accessor waits until there is one, and
    some ends never have one (a status code gRPC does not define, a local cancel)."""
    text = str(call)
    start = text.find(_DEBUG)
    if start < 0 or not text.endswith('"\n>'):
        return None
    value = text[start + len(_DEBUG):-3]
    return None if value == "None" else value


def _original(function: Any) -> Any:
    """A grpc constructor as grpcio defines it, under any wrapping that kept `__wrapped__` (install())."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


_insecure_channel = _original(grpc.insecure_channel)
_secure_channel = _original(grpc.secure_channel)
_aio_insecure_channel = _original(grpc.aio.insecure_channel)
_aio_secure_channel = _original(grpc.aio.secure_channel)

# -- sync attempts ---------------------------------------------------------------------------------------------


class SyncAttempts:
    """Every non-blocking sync attempt is a SyncAttempt, but a hedged (or timed) unary-unary call's, which show
    their headers before their response (SyncHeadersFirst)."""

    watch_spacing = WATCH_SPACING

    @staticmethod
    def shape(kind: str, hedged: bool) -> Tuple[str, bool, bool]:
        return kind, False, hedged and kind == "unary_unary"

    @staticmethod
    def method(channel: Any, name: str, shape: Tuple[str, bool, bool], owner: Any) -> Any:
        if shape[2]:
            return SyncHeadersFirst(channel, name, owner.workers)
        return SyncMethod(getattr(channel, shape[0])(name), shape[0], owner.workers)


class SyncMethod:
    """A method on one subchannel, made from grpcio's multicallable of it (`multicallable`: for an attempt made as
    one blocking call, sync_exchange): its attempts are grpcio's calls, each a SyncAttempt that reports its end."""

    __slots__ = ("multicallable", "_unary_response", "_workers")

    def __init__(self, multicallable: Any, kind: str, workers: Any) -> None:
        self.multicallable = multicallable
        self._unary_response = kind in _UNARY_RESPONSES
        self._workers = workers

    def __call__(self, request: Any, *, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None, **kwargs: Any) -> Any:
        """An attempt that tells its end to `on_end`. It never tells `on_headers` (sync_tells_headers): its headers
        come through grpcio's blocking accessor only."""
        m = self.multicallable
        call = m.future(request, **kwargs) if self._unary_response else m(request, **kwargs)
        return SyncAttempt(call, self._unary_response, self._workers, on_end)

    def blocking(self, requests: Any, **kwargs: Any) -> Any:
        """(Stream-unary.) A blocking attempt: grpcio's future, which the caller's thread waits for (run()) and
        reads; cancellable from another thread."""
        return WholeAttempt(self.multicallable.future(requests, **kwargs), None)


class _Reported:
    """An attempt whose end is read into `_state` (what sync_status() reads) before it is told; the grpc.Call the
    application gets of a call it won is made of it (sync_final)."""

    __slots__ = ("_call", "_state")

    _call: Any
    _state: AttemptState

    def _read_end(self, response: Any, headers: bool = True) -> None:
        """(A thread that may wait: the call has ended, or its end is near.) Its end, into `_state`; without
        `headers`, its initial metadata is left to be read when asked for (initial_metadata())."""
        call, state = self._call, self._state
        try:
            code = call.code()
            state.details = call.details()
            state.trailing_metadata = tuple(call.trailing_metadata() or ())
            if headers:
                state.initial_metadata = tuple(call.initial_metadata() or ())
            if code is not _OK:
                state.debug_error_string = _debug_error_string(call)
            else:
                state.response = response
            state.code = code
        except Exception as error:  # grpcio's accessors should not raise once the call ended: a bug of theirs
            state.code, state.details = grpc.StatusCode.INTERNAL, f"grpc_retry could not read an attempt: {error!r}"

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    # What FinishedCall reads of the attempt the application got
    def initial_metadata(self) -> Metadata:
        state = self._state
        if state.initial_metadata is None:  # (an attempt that ended OK: not read on grpcio's thread)
            state.initial_metadata = tuple(self._call.initial_metadata() or ())
        return state.initial_metadata

    def details(self) -> Optional[str]:
        return self._state.details

    def debug_error_string(self) -> Optional[str]:
        return self._state.debug_error_string


class SyncAttempt(_Reported):
    """One non-blocking sync attempt: grpcio's call, its end read into `_state` on a worker thread, then told to
    `on_end(self)`. Iterated, it reads the response stream."""

    __slots__ = ("_unary_response", "_workers", "_on_end", "_ended", "_running")

    def __init__(self, call: Any, unary_response: bool, workers: Any,
                 on_end: Optional[Callable[[Any], None]]) -> None:
        self._call = call
        self._state = AttemptState()
        self._unary_response = unary_response
        self._workers = workers
        self._on_end: Optional[Callable[[Any], None]] = on_end
        self._ended = False
        self._running = threading.Lock()  # held until it has ended: wait_end() waits on it (cheaper than an Event)
        self._running.acquire()
        if not call.add_callback(self._terminated):
            self._terminated()

    def _terminated(self) -> None:
        """grpcio's thread (or the maker's): the call has ended. An OK end is read and told here: a terminated
        call's status, trailing metadata and unary response are in, and the machine wants no headers of an OK end
        (they are read when the application asks). Else its end is read where a read may wait (its headers, which
        grpcio may tell after its status)."""
        call = self._call
        if call.code() is _OK:
            response = None
            if self._unary_response:
                try:
                    response = call.result()
                except Exception:  # (read again, and told, by _reported_end)
                    response = None
            if response is not None or not self._unary_response:
                self._read_end(response, False)
                self._tell_end()
                return
        _elsewhere(self._workers, self._reported_end, "grpc_retry-attempt-end")

    def _reported_end(self) -> None:
        call = self._call
        try:
            response = call.result() if self._unary_response and call.code() is _OK else None
        except Exception:  # (read again, and told, by _read_end)
            response = None
        self._read_end(response)
        self._tell_end()

    def _tell_end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._running.release()
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            tell(on_end, self)

    def __iter__(self) -> SyncAttempt:
        return self

    def __next__(self) -> bytes:
        return next(self._call)  # type: ignore[no-any-return]

    def done(self) -> bool:
        return self._ended

    def wait_headers(self) -> Tuple[Metadata, bool]:
        """Block until the response headers came or the attempt ended: (the headers, whether it has ended)."""
        metadata = tuple(self._call.initial_metadata() or ())
        return metadata, self._ended

    def wait_end(self) -> None:
        with self._running:  # (released at once: any number may wait)
            pass


def _elsewhere(workers: Any, task: Callable[[], None], name: str) -> None:
    """Run `task` on one of the channel's workers (a thread of its own once the channel has closed)."""
    try:
        workers.submit(task)
    except RuntimeError:  # the channel closed meanwhile
        threading.Thread(target=task, name=name, daemon=True).start()


class SyncHeadersFirst:
    """A hedged (or timed) unary-unary method on one subchannel: its attempts tell `on_headers(self)` when their
    response headers came (unless their end came with them), then `on_end(self)` once they have ended, from a
    thread that may wait on grpcio's public reads: the blocking call's caller, which polls its first attempt as
    grpcio's blocking call waits for its own, or a worker. grpcio's public API shows a unary response's headers
    ahead of it only through a unary-stream call, which grpcio runs as four batches, so an attempt that may be one
    batch (Method.first_whole) is grpcio's future. `multicallable`: grpcio's, for an attempt made as one blocking
    call."""

    __slots__ = ("multicallable", "_stream", "_workers")

    def __init__(self, channel: Any, name: str, workers: Any) -> None:
        self.multicallable = channel.unary_unary(name)
        self._stream = channel.unary_stream(name)
        self._workers = workers

    def __call__(self, request: bytes, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None, pollable: bool = False) -> HeadersFirstAttempt:
        """`pollable`: the blocking call's caller polls it (it is `polled`); else a worker does."""
        attempt = HeadersFirstAttempt(self._stream(request, timeout=timeout, metadata=metadata,
                                                   credentials=credentials, wait_for_ready=wait_for_ready,
                                                   compression=compression), on_headers, on_end, pollable)
        if not pollable:
            _elsewhere(self._workers, attempt.poll, "grpc_retry-attempt")
        return attempt

    def polled(self, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
               wait_for_ready: Optional[bool], compression: Any, on_headers: Callable[[Any], None],
               on_end: Callable[[Any], None], whole: bool) -> Any:
        """A blocking call's first attempt, polled by its caller; `whole`: one batch (Method.first_whole), whose
        headers show with its end (only `on_end` is told)."""
        if whole:
            return WholeAttempt(self.multicallable.future(
                request, timeout=timeout, metadata=metadata, credentials=credentials, wait_for_ready=wait_for_ready,
                compression=compression), on_end)
        return HeadersFirstAttempt(self._stream(request, timeout=timeout, metadata=metadata, credentials=credentials,
                                                wait_for_ready=wait_for_ready, compression=compression),
                                   on_headers, on_end, True)


class _Polled(_Reported):
    """An attempt whose caller reads it to its end on its own thread (poll(), once), then tells its end.
    Interrupted there (a signal's exception), the attempt is cancelled and tells its end before the exception goes
    on."""

    __slots__ = ("_on_end",)

    _on_end: Optional[Callable[[Any], None]]

    def poll(self) -> None:
        call = self._call
        try:
            response = self._answer(call)
        except BaseException:
            call.cancel()
            self._told(None)
            raise
        self._told(response)

    def _answer(self, call: Any) -> Any:
        """Read the attempt until it has ended: its response (None: none came)."""
        raise NotImplementedError

    def _told(self, response: Any) -> None:
        self._read_end(response)
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            tell(on_end, self)

    def done(self) -> bool:
        return self._state.code is not None


class HeadersFirstAttempt(_Polled):
    """A hedged unary attempt as grpcio's unary-stream call: poll() reads its headers, its response and its end,
    and tells them, on the thread that calls it."""

    __slots__ = ("_on_headers", "polled")

    def __init__(self, call: Any, on_headers: Optional[Callable[[Any], None]], on_end: Callable[[Any], None],
                 polled: bool) -> None:
        self._call = call
        self._state = AttemptState()
        self._on_headers: Optional[Callable[[Any], None]] = on_headers
        self._on_end = on_end
        self.polled = polled

    def _answer(self, call: Any) -> Any:
        headers = tuple(call.initial_metadata() or ())
        on_headers, self._on_headers = self._on_headers, None
        if on_headers is not None and (headers or not call.done()):  # else cancelled, or its end tells them
            self._state.initial_metadata = headers
            tell(on_headers, self)
        response = None
        try:
            for message in call:  # one message, then the end
                response = message
        except grpc.RpcError:  # (the end tells how)
            pass
        return response


class WholeAttempt(_Polled):
    """grpcio's future, which its caller waits for (poll(), or run()), then reads and tells: a hedged unary call's
    first attempt as one batch (Method.first_whole; its headers show with its end), or a blocking stream-unary
    attempt."""

    __slots__ = ()
    polled = True

    def __init__(self, call: Any, on_end: Optional[Callable[[Any], None]]) -> None:
        self._call = call
        self._state = AttemptState()
        self._on_end = on_end

    def _answer(self, call: Any) -> Any:
        try:
            return call.result()
        except (grpc.RpcError, grpc.FutureCancelledError):  # (the end tells how)
            return None

    def run(self, workers: Any) -> WholeAttempt:
        """(A blocking stream-unary attempt's caller.) Until it has ended; then itself, its end read."""
        self.poll()
        return self


FINAL_WRAPPED = True  # attempts are no grpc.Call to give the application: sync_final() makes one


def sync_final(call: Any, response: Any) -> Any:
    trailing = call._state.trailing_metadata if isinstance(call, _Reported) else tuple(call.trailing_metadata() or ())
    return FinishedCall(call, trailing, response)


def sync_status(call: Any) -> Tuple[Any, Optional[str], Metadata, Optional[str], Metadata]:
    """An ended attempt's (code, details, trailing metadata, debug error string, initial metadata): a SyncAttempt's
    as read on its end, or what grpcio's own ended call (or the error a blocking call raised) answers."""
    if isinstance(call, _Reported):
        state = call._state
        return (state.code, state.details, state.trailing_metadata, state.debug_error_string,
                state.initial_metadata or ())
    code = call.code()
    return (code, call.details(), tuple(call.trailing_metadata() or ()),
            None if code is _OK else _debug_error_string(call), tuple(call.initial_metadata() or ()))


def sync_code(call: Any) -> Any:
    return call._state.code if isinstance(call, _Reported) else call.code()


def sync_response(call: Any) -> Any:
    return call._state.response if isinstance(call, _Reported) else None


def sync_tells_headers(call: Any) -> bool:
    """No attempt of this transport tells its headers: a thread waits for them (sync_wait_headers)."""
    return False


def sync_wait_headers(call: Any) -> Tuple[Metadata, bool]:
    """Block (never on grpcio's own thread) until an attempt has its response headers or has ended."""
    return call.wait_headers()  # type: ignore[no-any-return]


def sync_wait_end(call: Any) -> None:
    call.wait_end()


# -- sync subchannels ------------------------------------------------------------------------------------------


def new_sync_channel(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                     compression: Optional[grpc.Compression]) -> grpc.Channel:
    """A subchannel: grpc's own constructor, as grpcio defines it (not as install() replaced it)."""
    if credentials is None:
        return _insecure_channel(target, options=tuple(options), compression=compression)  # type: ignore[no-any-return]
    return _secure_channel(target, credentials, options=tuple(options),  # type: ignore[no-any-return]
                           compression=compression)


def new_sync_channel_with_id(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                             compression: Optional[grpc.Compression]) -> Tuple[grpc.Channel, Optional[int]]:
    """A subchannel, and no channelz id: grpcio's public API does not tell one."""
    return new_sync_channel(target, options, credentials, compression), None


def channelz_subchannels(cid: int) -> Optional[Tuple[bytes, ...]]:
    return None


class _Connectivity:
    """A sync channel's state as grpcio's subscribe() tells it (grpc.ChannelConnectivity's number; IDLE until told)."""

    __slots__ = ("_channel", "_condition", "state", "_connect_asked", "_closed", "__weakref__")

    def __init__(self, channel: grpc.Channel, try_to_connect: bool) -> None:
        self._channel = weakref.ref(channel)
        self._condition = threading.Condition()
        self.state = 0
        # When grpcio's watch was last asked to connect the channel (monotonic).
        self._connect_asked = time.monotonic() if try_to_connect else -1.0
        self._closed = False
        channel.subscribe(self._changed, try_to_connect=try_to_connect)

    def _changed(self, connectivity: grpc.ChannelConnectivity) -> None:
        with self._condition:
            self.state = int(connectivity.value[0])
            self._condition.notify_all()

    def read(self, try_to_connect: bool) -> int:
        channel = self._channel()
        if channel is None:
            raise ValueError("closed")
        if try_to_connect and self.state == 0:
            with self._condition:
                if self._closed:
                    raise ValueError("closed")
                self._connect_asked = time.monotonic()
                channel.subscribe(_ignored, try_to_connect=True)  # grpcio's watch connects it, within 0.2 s
                channel.unsubscribe(_ignored)
        return self.state

    def close(self, channel: grpc.Channel) -> float:
        """Stop following the channel (read() raises from now on): how long to let grpcio's watch come round
        before the channel closes, if a connection was asked for."""
        with self._condition:
            self._closed = True
            channel.unsubscribe(self._changed)
            return self._connect_asked + _WATCH_ROUND - time.monotonic()

    def wait(self, last: int, timeout: float) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: self.state != last, timeout)


_WATCH_ROUND = 0.5  # grpcio's connectivity watch of a channel wakes every 0.2 s, then acts once it has the GIL


def _ignored(_: Any) -> None:
    pass


_CONNECTIVITY: weakref.WeakKeyDictionary[grpc.Channel, _Connectivity] = weakref.WeakKeyDictionary()
_CONNECTIVITY_LOCK = threading.Lock()
_CLOSED: weakref.WeakSet[grpc.Channel] = weakref.WeakSet()


def _connectivity(channel: grpc.Channel, try_to_connect: bool = False) -> _Connectivity:
    """The channel's connectivity, followed from now on (connecting it at once if `try_to_connect`)."""
    with _CONNECTIVITY_LOCK:
        found = _CONNECTIVITY.get(channel)
        if found is None:
            if channel in _CLOSED:  # (grpcio's watch of a closed channel fails on its own thread)
                raise ValueError("closed")
            found = _CONNECTIVITY[channel] = _Connectivity(channel, try_to_connect)
            try_to_connect = False
    if try_to_connect:
        found.read(True)
    return found


def sync_state_reader(channel: Any) -> Callable[[bool], int]:
    return _connectivity(channel).read


def sync_connectivity(channel: Any, try_to_connect: bool) -> int:
    return _connectivity(channel, try_to_connect).state


def sync_calls_in_flight(channel: Any) -> int:
    """Unknown through grpcio's public API: a retired subchannel is taken as busy until its grace ends."""
    return 1


def sync_watch_connectivity(channel: Any, last: int, timeout: float) -> bool:
    return _connectivity(channel).wait(last, timeout)


def close_sync_channel(channel: grpc.Channel) -> None:
    """Close a subchannel, aside: grpcio's close waits for its connectivity watch to come round (up to 0.2 s). A
    connection asked for lately is first let reach the watch (_WATCH_ROUND): once closed, the watch would fail
    there, on grpcio's thread, with a traceback."""
    with _CONNECTIVITY_LOCK:
        connectivity = _CONNECTIVITY.pop(channel, None)
        _CLOSED.add(channel)
    if connectivity is None:
        channel.close()
        return
    wait = connectivity.close(channel)

    def close() -> None:
        if wait > 0:
            time.sleep(wait)
        channel.close()
    threading.Thread(target=close, name="grpc_retry-close", daemon=True).start()


# -- asyncio subchannels ----------------------------------------------------------------------------------------


def aio_working_loop() -> asyncio.AbstractEventLoop:
    """The loop a grpc.aio channel made now binds to: the running one, or (outside a coroutine) the current one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return asyncio.get_event_loop_policy().get_event_loop()


def new_aio_channel(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                    compression: Optional[grpc.Compression]) -> grpc.aio.Channel:
    if credentials is None:
        return _aio_insecure_channel(target, options=tuple(options),  # type: ignore[no-any-return]
                                     compression=compression)
    return _aio_secure_channel(target, credentials, options=tuple(options),  # type: ignore[no-any-return]
                               compression=compression)


SYNC = SyncAttempts()
AIO = AioAttempts()

__all__ = ["AIO", "AioAttempt", "FINAL_WRAPPED", "SYNC", "aio_intercepted", "aio_working_loop",
           "channelz_subchannels", "close_sync_channel", "new_aio_channel", "new_sync_channel",
           "new_sync_channel_with_id", "sync_calls_in_flight", "sync_code", "sync_connectivity", "sync_exchange",
           "sync_final", "sync_response", "sync_state_reader", "sync_status", "sync_tells_headers", "sync_wait_end",
           "sync_wait_headers", "sync_watch_connectivity"]
