"""The transport interface: what the drivers and subchannels may ask of a transport, whichever serves. Each
transport module (direct.py, portable.py) is checked against `Transport` by mypy (`_transport/__init__.py` assigns
it to a variable of that type); nothing outside grpc_retry/_transport/ names either module or grpcio's private
names (grpc_private.py)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional, Protocol, Tuple

import grpc

Metadata = Tuple[Any, ...]
Shape = Tuple[str, bool, bool]  # (grpcio's multicallable kind, unary own, headers first)
Status = Tuple[Any, Optional[str], Metadata, Optional[str], Metadata]  # code, details, trailing, debug, initial


class Attempts(Protocol):
    """A transport's maker of attempts for one API (`SYNC`, `AIO`)."""

    # How many times rarer than the core's WATCH_EVERY a watched method's sampled call is (the one whose first
    # attempt shows its headers first, headerswatch.pyx.pxi): what such an attempt costs on this transport.
    watch_spacing: int

    def shape(self, kind: str, hedged: bool) -> Shape:
        """How a method's attempts are made (Method reads it once)."""

    def method(self, channel: Any, name: str, shape: Shape, owner: Any) -> Any:
        """The method `name` on one subchannel, that attempts are started through."""


class SyncMethod(Protocol):
    """A method on one sync subchannel (what `Attempts.method` makes for SYNC). Called, it makes a non-blocking
    attempt: a grpc.Call-like object whose end record ends.end_record()/sync_status() read once it has told
    `on_end(attempt)`, once, from whichever thread saw its end. Where the attempt can (sync_tells_headers), it tells
    `on_headers(attempt)` when its response headers came before its end. Raises what grpcio raises for a call it
    cannot start."""

    @property
    def multicallable(self) -> Any:
        """grpcio's multicallable of the method, for an attempt made as one blocking exchange (sync_exchange)."""

    def __call__(self, request: Any, /, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, on_end: Callable[[Any], None],
                 on_headers: Optional[Callable[[Any], None]] = None) -> Any: ...


class SyncStreamUnaryMethod(SyncMethod, Protocol):
    """A stream-unary method on one sync subchannel: its attempts can be blocking ones too."""

    def blocking(self, requests: Any, /, *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> BlockingAttempt: ...


class BlockingAttempt(Protocol):
    """A blocking stream-unary attempt (`SyncMethod.blocking(requests, ...)` of a stream-unary method): run() on
    the caller's thread until it has ended, giving the ended attempt; cancel() from any thread."""

    def run(self, workers: Any) -> Any: ...
    def cancel(self) -> bool: ...


class AioAttempt(Protocol):
    """One asyncio attempt, on either transport. It tells the driver what happens through the callbacks it is given:
    `on_headers()` (its response headers came; headers first only), `on_end(response or EOF)`, and with a request
    stream `on_sent()` (its metadata went out) and `on_written()` (a message written went). Its status and headers,
    once told, are read with ends.aio_status() and ends.aio_initial_metadata(). It answers what grpc.aio's channel
    asks of its calls."""

    on_headers: Optional[Callable[[], None]]
    on_end: Optional[Callable[[Any], None]]
    on_sent: Optional[Callable[[], None]]
    on_written: Optional[Callable[[], None]]
    sent: bool

    @property
    def refusal(self) -> Optional[BaseException]:
        """What grpcio raised instead of making the call, where that is raised later than the call is made."""

    def write(self, data: bytes) -> None: ...
    def half_close(self) -> None: ...
    def read(self) -> Optional[Awaitable[Any]]: ...
    def cancel(self) -> bool: ...
    def done(self) -> bool: ...
    def add_done_callback(self, callback: Callable[[Any], None]) -> None: ...
    async def initial_metadata(self) -> Metadata: ...
    async def wait_for_connection(self) -> None: ...
    async def code(self) -> Any: ...


class Transport(Protocol):
    """What a transport module provides."""

    @property
    def SYNC(self) -> Attempts: ...  # noqa: N802 (the module's constants)
    @property
    def AIO(self) -> Attempts: ...  # noqa: N802
    @property
    def FINAL_WRAPPED(self) -> bool:  # noqa: N802
        """Whether a sync attempt is no grpc.Call to give the application (sync_final() makes one)."""

    # Sync attempts: a blocking exchange, and what an ended one tells, read without blocking
    def sync_exchange(self, m: Any, request: bytes, timeout: Optional[float], metadata: Any, credentials: Any,
                      wait_for_ready: Optional[bool], compression: Any, call_wanted: bool) -> Tuple[Any, Any, bool]:
        """A blocking unary-unary exchange on the caller's thread: (its ended call, the error grpcio raised, or
        None if it succeeded and no call is wanted; its response; whether it succeeded)."""
    def sync_final(self, call: Any, response: Any) -> Any: ...
    def sync_status(self, call: Any) -> Status: ...
    def sync_code(self, call: Any) -> Any: ...
    def sync_response(self, call: Any) -> Any: ...
    def sync_tells_headers(self, call: Any) -> bool: ...
    def sync_wait_headers(self, call: Any) -> Tuple[Metadata, bool]: ...
    def sync_wait_end(self, call: Any) -> None: ...

    # Subchannels: grpcio channels to one address each, and their connectivity
    def new_sync_channel(self, target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                         compression: Optional[grpc.Compression]) -> grpc.Channel: ...
    def new_sync_channel_with_id(self, target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                                 compression: Optional[grpc.Compression]) -> Tuple[grpc.Channel, Optional[int]]: ...
    def channelz_subchannels(self, cid: int) -> Optional[Tuple[bytes, ...]]: ...
    def close_sync_channel(self, channel: grpc.Channel) -> None: ...
    def sync_state_reader(self, channel: Any) -> Callable[[bool], int]: ...
    def sync_connectivity(self, channel: Any, try_to_connect: bool) -> int: ...
    def sync_calls_in_flight(self, channel: Any) -> int: ...
    def sync_watch_connectivity(self, channel: Any, last: int, timeout: float) -> bool: ...
    def aio_working_loop(self) -> asyncio.AbstractEventLoop: ...
    def new_aio_channel(self, target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                        compression: Optional[grpc.Compression]) -> grpc.aio.Channel: ...
    def aio_intercepted(self, kind: str) -> type: ...
