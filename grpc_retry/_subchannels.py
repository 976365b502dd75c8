"""A channel's backends: the resolved addresses, one grpcio channel per address (C-core's retries off),
their connectivity, and the picker that chooses one for each attempt.

Indices are stable: an address keeps its index for the channel's life (a vanished one is shut down, a new one
is appended), so calls can remember the addresses they used as a bit mask. Connectivity is watched, never
polled: grpc's subscribe() for the sync flavor, wait_for_state_change() for aio. DNS lookups run on a thread,
never on the caller's thread or the event loop, and again when every subchannel has failed (at most once per
`min_resolution_interval`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from time import monotonic
from typing import Any, Callable, List, Optional, Tuple

import grpc

from grpc_retry import _grpc_internals as internals
from grpc_retry import _install as constructors
from grpc_retry._core import PICK_FIRST, ROUND_ROBIN, Picker
from grpc_retry._options import RetryOptions
from grpc_retry._resolver import parse_target, resolve
from grpc_retry._timer import TIMERS, TimerHandle

log = logging.getLogger("grpc_retry")

_IDLE = 0
_READY = 2
_TRANSIENT_FAILURE = 3
_SHUTDOWN = 4
# Sync subchannels: the longest a connectivity watch blocks before it looks whether its subchannel was closed.
POLL = 0.2


class Subchannels:
    min_resolution_interval = 30.0

    def __init__(self, target: str, options: RetryOptions, credentials: Optional[grpc.ChannelCredentials],
                 compression: Optional[grpc.Compression]) -> None:
        self.target = parse_target(target)
        self._credentials = credentials
        self.secure = credentials is not None
        self._compression = compression
        self._options = self._subchannel_options(options)
        self.picker = Picker(ROUND_ROBIN if options.lb_policy == "round_robin" else PICK_FIRST, 0)
        # round_robin spreads over every address, so it connects them all (as grpc's does); pick_first
        # connects one at a time, in order.
        self._eager = options.lb_policy == "round_robin"
        self._connected = 0  # addresses whose subchannel was started eagerly
        self._connecting = False  # try_to_connect asked for a connection and none is READY yet
        self.addresses: List[str] = []
        self._channels: List[Any] = []
        self._lock = threading.RLock()
        self._listeners: List[Callable[[], None]] = []   # one-shot: waiters for the next change
        self._watchers: List[Callable[[], None]] = []    # persistent: connectivity subscribers
        self.resolving = False
        self.resolution_error: Optional[str] = None
        self._last_resolution = float("-inf")
        self._resolution_timer: Optional[TimerHandle] = None
        self.closed = False
        if self.target.scheme == "static":
            self._set_addresses(list(self.target.addresses))
        else:
            self._resolve()

    def _subchannel_options(self, options: RetryOptions) -> List[Tuple[str, Any]]:
        extra: List[Tuple[str, Any]] = [("grpc.enable_retries", 0)]
        given = dict(options.passthrough)
        # Subchannels are reached by address; they speak for the original name, as grpcio's channel would —
        # or, on a secure channel with grpc.ssl_target_name_override, for that name, as grpcio's does.
        if "grpc.default_authority" not in given:
            override = given.get("grpc.ssl_target_name_override") if self._credentials is not None else None
            extra.append(("grpc.default_authority", override if override is not None else self.target.authority))
        if self._credentials is not None and "grpc.ssl_target_name_override" not in given and self.target.host:
            extra.append(("grpc.ssl_target_name_override", self.target.host))
        return list(options.passthrough) + extra

    # -- resolution -------------------------------------------------------------------------------------

    @property
    def resolved(self) -> bool:
        return bool(self.addresses) or self.resolution_error is not None

    @property
    def generation(self) -> int:
        """Bumped on every change: a waiter that read it before looking at the states cannot miss a change."""
        return self.picker.generation

    def _resolve(self) -> None:
        with self._lock:
            if self.resolving or self.closed:
                return
            self.resolving = True
            self._last_resolution = monotonic()
        threading.Thread(target=self._resolve_now, name="grpc_retry-resolver", daemon=True).start()

    def _resolve_now(self) -> None:
        try:
            addresses = resolve(self.target)
            error = None if addresses else f"DNS resolution of {self.target.host!r} returned no addresses"
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode
            addresses, error = [], f"DNS resolution of {self.target.host!r} failed: {exc}"
        with self._lock:
            self.resolving = False
            if addresses:
                self.resolution_error = None
                self._set_addresses(addresses)
            elif not self.addresses:
                self.resolution_error = error
            self.picker.resolved = self.resolved
        if error:
            log.warning("grpc_retry: %s", error)
            self._maybe_resolve_again()  # nothing new to connect to: look again when the interval allows
        elif self._connecting:
            self._on_own_thread(self._connect_next)  # a connect asked for before the name resolved
        self._notify()

    def _set_addresses(self, addresses: List[str]) -> None:
        with self._lock:
            for index, address in enumerate(self.addresses):
                if address not in addresses and self.picker.state(index) != _SHUTDOWN:
                    self.picker.set_state(index, _SHUTDOWN)
                    channel, self._channels[index] = self._channels[index], None
                    if channel is not None:
                        self._close_channel(channel)
            for address in addresses:
                if address in self.addresses:
                    index = self.addresses.index(address)
                    if self.picker.state(index) == _SHUTDOWN:  # back again
                        self.picker.set_state(index, 0)
                else:
                    self.addresses.append(address)
                    self._channels.append(None)
                    self.picker.resize(len(self.addresses))
            self.picker.resolved = self.resolved

    # -- subchannels ------------------------------------------------------------------------------------

    def channel(self, index: int, connect: bool = False) -> Any:
        """The grpcio channel of address `index`, created on first use; `connect`: make it connect now."""
        if self._eager and self._connected < len(self.addresses):
            self._connect_all()
        channel = self._channels[index]
        if channel is None:
            with self._lock:
                channel = self._channels[index]
                if channel is None:
                    if self.closed:
                        raise self._closed_error()
                    channel = self._channels[index] = self._make_channel(self.addresses[index])
                    self._watch(index, channel, connect)
                    return channel
        if connect:
            self._kick(channel)
        return channel

    def _connect_all(self) -> None:
        with self._lock:
            start, self._connected = self._connected, len(self.addresses)
        for index in range(start, self._connected):
            if self.picker.state(index) != _SHUTDOWN:
                self.channel(index, connect=True)

    def on_state(self, index: int, state: int) -> None:
        if self._channels[index] is None:
            return
        self.picker.set_state(index, state)
        if state == _READY:
            self._connecting = False
        elif state == _TRANSIENT_FAILURE:
            if self._connecting:
                self._connect_next()
            if self.target.scheme == "dns" and self.picker.all_failed():
                self._maybe_resolve_again()
        self._notify()

    def _maybe_resolve_again(self) -> None:
        """Every subchannel failed: look the name up again, at most once per min_resolution_interval (a
        lookup that is not due yet is deferred to when it is, not dropped)."""
        with self._lock:
            if self.closed or self.resolving or self._resolution_timer is not None:
                return
            wait = self._last_resolution + self.min_resolution_interval - monotonic()
            if wait > 0:
                self._resolution_timer = TIMERS.schedule(wait, self._deferred_resolution)
                return
        self._resolve()

    def _deferred_resolution(self) -> None:
        with self._lock:
            self._resolution_timer = None
        if self.picker.all_failed():
            self._resolve()

    # -- waiting for a change ---------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def when_changed(self, since: int, listener: Callable[[], None]) -> bool:
        """Call `listener` once at the next change, unless generation already moved past `since`
        (then False, and nothing is registered: the caller looks again)."""
        with self._lock:
            if self.generation != since:
                return False
            self._listeners.append(listener)
            return True

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            try:
                self._listeners.remove(listener)
            except ValueError:
                pass

    def watch(self, watcher: Callable[[], None], add: bool = True) -> None:
        with self._lock:
            if add:
                self._watchers.append(watcher)
            elif watcher in self._watchers:
                self._watchers.remove(watcher)

    def aggregate_state(self) -> grpc.ChannelConnectivity:
        """The channel's connectivity as grpcio reports it for one channel: READY if any subchannel is; SHUTDOWN
        once closed; TRANSIENT_FAILURE when the name did not resolve."""
        if self.closed:
            return grpc.ChannelConnectivity.SHUTDOWN
        states = [s for s in self.picker.states() if s != _SHUTDOWN]
        if not states and self.resolution_error is not None:
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        for value, state in ((2, grpc.ChannelConnectivity.READY), (1, grpc.ChannelConnectivity.CONNECTING)):
            if value in states:
                return state
        if states and all(s == _TRANSIENT_FAILURE for s in states):
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        return grpc.ChannelConnectivity.IDLE

    def connect(self) -> None:
        """try_to_connect: start the subchannel the picker would use first and, as grpcio's pick_first does,
        the next one each time one fails, until one is READY."""
        self._connecting = True
        self._connect_next()

    def _connect_next(self) -> None:
        if self.addresses and not self.closed:
            index = self.picker.pick(0)
            if index >= 0 and self.picker.state(index) == _IDLE:
                self.channel(index, connect=True)

    def _kick(self, channel: Any) -> None:
        channel.get_state(True) if hasattr(channel, "get_state") else None

    def _notify(self) -> None:
        with self._lock:
            self.picker.generation += 1
            listeners, self._listeners = self._listeners, []
            listeners += self._watchers
        for listener in listeners:
            try:
                listener()
            except Exception:
                log.exception("subchannel listener failed")

    def unavailable_details(self) -> str:
        if self.resolution_error:
            return self.resolution_error
        return f"failed to connect to all addresses of {self.target.authority!r}"

    # -- flavor hooks -----------------------------------------------------------------------------------

    def _make_channel(self, address: str) -> Any:
        raise NotImplementedError

    def _watch(self, index: int, channel: Any, connect: bool) -> None:
        raise NotImplementedError

    def _close_channel(self, channel: Any) -> None:
        raise NotImplementedError

    def _closed_error(self) -> Exception:
        return ValueError("Cannot invoke RPC on closed channel!")

    def _on_own_thread(self, fn: Callable[[], None]) -> None:
        """Run fn where the flavor makes its subchannels (sync: any thread)."""
        fn()

    def _stop_timers(self) -> None:
        with self._lock:
            timer, self._resolution_timer = self._resolution_timer, None
        if timer is not None:
            timer.cancel()

    def states(self) -> List[grpc.ChannelConnectivity]:
        by_value = {c.value[0]: c for c in grpc.ChannelConnectivity}
        return [by_value[s] for s in self.picker.states()]


class SyncSubchannels(Subchannels):
    def _make_channel(self, address: str) -> Any:  # a grpc.Channel (maybe wrapped by an instrumentation)
        if self._credentials is None:
            return constructors.grpc_insecure_channel(address, options=self._options,
                                                      compression=self._compression)
        return constructors.grpc_secure_channel(address, self._credentials, options=self._options,
                                                compression=self._compression)

    def _watch(self, index: int, channel: grpc.Channel, connect: bool) -> None:
        threading.Thread(target=self._poll, args=(index, channel, connect), name="grpc_retry-connectivity",
                         daemon=True).start()

    def _poll(self, index: int, channel: grpc.Channel, connect: bool) -> None:
        """A subchannel's connectivity, watched until it is closed (as grpcio's subscribe() does, on a thread of
        ours: grpcio's poller dies with a traceback when the channel closes between two of its watches)."""
        try:
            state = internals.sync_connectivity(channel, connect)
            while self._channels[index] is channel:  # not closed, nor replaced
                self.on_state(index, state)
                while not internals.sync_watch_connectivity(channel, state, POLL):
                    if self._channels[index] is not channel:
                        return
                state = internals.sync_connectivity(channel, False)
        except ValueError:  # closed
            return

    def _close_channel(self, channel: Any) -> None:
        """Close a subchannel on a thread of its own: grpcio's close cancels the subchannel's calls at once, then
        waits for the connectivity watch in progress (up to POLL seconds), which is not the caller's wait."""
        threading.Thread(target=channel.close, name="grpc_retry-close", daemon=True).start()

    def _kick(self, channel: Any) -> None:
        internals.sync_connectivity(channel, True)

    def wait_change(self, timeout: Optional[float], since: Optional[int] = None,
                    event: Optional[threading.Event] = None) -> None:
        """Block until the next change (or one after generation `since`), `timeout` or `event` is set
        (the caller's way to cut the wait short)."""
        event = event if event is not None else threading.Event()
        if since is None:
            since = self.generation
        if not self.when_changed(since, event.set):
            return
        try:
            event.wait(timeout)
        finally:
            self.remove_listener(event.set)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            channels, self._channels = self._channels, [None] * len(self._channels)
        self._stop_timers()
        for channel in channels:
            if channel is not None:
                self._close_channel(channel)
        self._notify()


class AioSubchannels(Subchannels):
    def __init__(self, *args: Any) -> None:
        self._tasks: List[asyncio.Task[Any]] = []
        # The loop grpc.aio's own channel would bind to (made outside a coroutine too, with no deprecation
        # warning on Python 3.12+).
        self._loop: Optional[asyncio.AbstractEventLoop] = internals.aio_working_loop()
        super().__init__(*args)

    def _make_channel(self, address: str) -> Any:  # a grpc.aio.Channel
        if self._credentials is None:
            return constructors.grpc_aio_insecure_channel(address, options=self._options,
                                                          compression=self._compression)
        return constructors.grpc_aio_secure_channel(address, self._credentials, options=self._options,
                                                    compression=self._compression)

    def _closed_error(self) -> Exception:
        return grpc.aio.UsageError("Channel is closed.")

    def _on_own_thread(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def _watch(self, index: int, channel: grpc.aio.Channel, connect: bool) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_loop(index, channel, connect)))

    async def _watch_loop(self, index: int, channel: grpc.aio.Channel, connect: bool) -> None:
        try:
            state = channel.get_state(connect)
            while True:
                self.on_state(index, state.value[0])
                await channel.wait_for_state_change(state)
                state = channel.get_state(False)
        except (asyncio.CancelledError, grpc.aio.UsageError, RuntimeError):
            return

    def _close_channel(self, channel: Any) -> None:
        # Called from the resolver thread too: hand the close to the channel's loop.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: loop.create_task(channel.close()))

    async def wait_change(self, timeout: Optional[float], since: Optional[int] = None) -> None:
        """Wait for the next change (or one after generation `since`), or `timeout`."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_settle, future)

        if not self.when_changed(self.generation if since is None else since, wake):
            return
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self.remove_listener(wake)

    async def close(self, grace: Optional[float] = None) -> None:
        with self._lock:
            self.closed = True
            channels, self._channels = self._channels, [None] * len(self._channels)
            tasks, self._tasks = self._tasks, []
        self._stop_timers()
        for task in tasks:
            task.cancel()
        for channel in channels:
            if channel is not None:
                await channel.close(grace)
        # The attempts this cancelled finish in C-core a moment later; let their completions run on this loop
        # now, or grpc.aio hands them to a loop that may be closed by then (and drops other loops' events).
        for _ in range(3):
            await asyncio.sleep(0)
        self._notify()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
