"""Sync subchannels, their connectivity watched by one thread for the whole process.

grpcio's sync API watches a channel's connectivity with a thread per channel (subscribe(), or a blocking
watch_connectivity_state() on the channel's own completion queue): 600 subchannels would be 600 threads, each
sitting inside a blocking grpcio call, which also stops grpcio's fork handlers. Here one poller thread reads every
subchannel's state with the non-blocking check (0.3 µs each), as often as its state needs: a subchannel that is
connecting, or that an attempt was just sent to while not READY, every 5 ms; one that is down, every 250 ms; a
READY or unused one every 2 s (at 1 s, 600 subchannels would cost 0.1% of a core) — and at once when something
tells it to look (an attempt sent to it, a kick). A READY subchannel whose connection is lost is seen within 2 s;
an attempt sent to it meanwhile reconnects it, as on a grpcio channel. Under calls, that reconnection leaves the
loss in view for well under a millisecond (IDLE until the next call, CONNECTING for a loopback handshake): only
attempts see it. A name's subchannels are read by each attempt just after it started (attempt_started), and what
a read can still miss shows in channelz, which the poller reads for them (CHANNELZ_BUDGET); given addresses' are
read at most once a millisecond, before an attempt (ATTEMPT_READ_EVERY).
While some subchannel is connecting or down, the poller waits for its next sweep inside a short grpcio watch (at
most 50 ms), which polls grpcio: older grpcio (1.70) makes a sync connection progress only while a thread does.
While every subchannel is READY or unused, it never enters grpcio but for the non-blocking checks, so grpcio's
fork handlers run. It ends when no subchannel is left, and does not outlive a fork.
"""

from __future__ import annotations

import os
import threading
import weakref
from time import monotonic, perf_counter
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc

from grpc_retry._backends import health
from grpc_retry._backends.subchannels import CONNECTING, READY, RETIRE_GRACE, TRANSIENT_FAILURE, Subchannels, log
from grpc_retry._serial import SerialThread
from grpc_retry._timer import TIMERS
from grpc_retry._transport import transport as internals

FAST, MEDIUM, SLOW = 0.005, 0.25, 2.0
HOT = 2.0  # after a kick or an attempt sent to it while not READY, a subchannel is watched FAST this long
DRIVE = 0.05  # the longest the poller waits inside a grpcio watch (a poke waits at most this long)
# Attempts to addresses given as such read their subchannel's state at most this often, as they are sent: a read
# takes the grpcio channel's lock, which each of its own calls takes too (read on every attempt, it costs sync calls
# at 16 in flight ~4% of their CPU), and there a missed loss costs nothing (the next call reconnects). A name's
# subchannels are read by every attempt, just after it started (attempt_started): a lost connection is when the name
# is looked up again (a pod's max_connection_age, the usual way to have clients find new pods). Read before it
# started, the attempt that reconnected a subchannel could miss that: another thread's call reads the GOAWAY
# (on grpcio 1.70, inside its own polling) between this attempt's read and its start, and the reconnection is over
# by the next attempt's read. Read after, that attempt mostly finds it CONNECTING, or IDLE.
ATTEMPT_READ_EVERY = 0.001
# Still, a loss can come and go between two attempts' reads: on grpcio 1.70 a call's polling reads the GOAWAY and
# the next attempt's start has the connection made again, within half a millisecond (4 threads calling through a
# name whose pod's connections live 1 s: 7 losses in 59 unseen by reads). What stays is in channelz: a name's
# grpcio channel holds a new subchannel for each connection it makes. The poller compares them on each subchannel
# attempts have used, every MEDIUM at most; such a read costs ~4 us on grpcio 1.70 and ~150 on 1.85 (its channelz
# answers are built through protobuf), so reads are spaced out to take at most CHANNELZ_BUDGET of a core.
CHANNELZ_BUDGET = 0.002


class _Entry:
    """One watched subchannel."""

    __slots__ = ("owner", "index", "channel", "read", "state", "seen", "hot_until", "period", "dead", "drain_until",
                 "read_after", "cid", "links", "used", "check_after")

    def __init__(self, owner: SyncSubchannels, index: int, channel: grpc.Channel, cid: Optional[int]) -> None:
        self.owner = weakref.ref(owner)  # a channel dropped without close() is not kept alive by its poller
        self.index = index
        self.channel = channel
        self.read = internals.sync_state_reader(channel)
        self.state = -1  # not read yet
        self.seen = -1   # a state an attempt saw, for the poller to report (-1: none)
        self.hot_until = 0.0
        self.period = FAST
        self.dead = False
        self.drain_until = 0.0  # retired: closed once its calls end, or then at the latest
        self.read_after = 0.0  # attempts read its state again from then on
        self.cid = cid      # a name's: its grpcio channel's channelz id (see CHANNELZ_BUDGET)
        self.links: Tuple[bytes, ...] = ()  # the channelz ids of that channel's subchannels, last read (): unread
        self.used = False   # an attempt started on it since those were read
        self.check_after = 0.0


class Poller:
    """The process's connectivity poller: entries grouped by how often they are read."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._groups: Dict[float, List[_Entry]] = {FAST: [], MEDIUM: [], SLOW: []}
        self._due: Dict[float, float] = {FAST: 0.0, MEDIUM: 0.0, SLOW: 0.0}
        self._count = 0
        self._named = 0  # entries with a channelz id
        self._channelz_cost = 0.0  # seconds a channelz read takes (a moving average)
        self._thread: Optional[threading.Thread] = None

    def add(self, entry: _Entry) -> None:
        """A new subchannel: an attempt is about to be sent to it, or it is to connect (read FAST for HOT)."""
        entry.hot_until = monotonic() + HOT
        with self._cond:
            self._groups[FAST].append(entry)
            self._count += 1
            self._named += entry.cid is not None
            self._due[FAST] = 0.0
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="grpc_retry-connectivity", daemon=True)
                self._thread.start()
            self._cond.notify()

    def poke(self, entry: _Entry) -> None:
        """Look at this entry soon, and often for a while."""
        entry.hot_until = monotonic() + HOT
        if entry.period != FAST:
            with self._cond:
                if entry.period != FAST and not entry.dead:
                    self._groups[entry.period].remove(entry)
                    entry.period = FAST
                    self._groups[FAST].append(entry)
                    self._due[FAST] = 0.0
                    self._cond.notify()

    def remove(self, entry: _Entry) -> None:
        entry.dead = True  # dropped at its group's next sweep

    def retire(self, entry: _Entry) -> None:
        """Close the entry's channel once it has no call in flight (RETIRE_GRACE at the latest)."""
        entry.drain_until = monotonic() + RETIRE_GRACE

    def entries(self) -> int:
        with self._cond:
            return self._count

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._count == 0:
                        self._thread = None
                        return
                    now = monotonic()
                    due = [period for period, group in self._groups.items() if group and self._due[period] <= now]
                    if due:
                        break
                    wake = min(self._due[p] for p, group in self._groups.items() if group) - now
                    driven = self._to_drive()
                    if driven is not None:
                        break
                    self._cond.wait(wake)
                if not due:
                    sweeps = []
                else:
                    sweeps = [(period, list(self._groups[period])) for period in due]
                    for period in due:
                        self._due[period] = now + period
            if not due:
                self._drive(driven, wake)  # type: ignore[arg-type]
                continue
            moves = []
            for period, group in sweeps:
                for entry in group:
                    if period == SLOW and not entry.dead and not entry.drain_until:  # most: READY, unchanged
                        try:
                            if entry.read(False) == entry.state == READY and not entry.used:
                                continue
                        except ValueError:
                            pass
                    wanted = self._read(entry, now)
                    if wanted != period:
                        moves.append((entry, period, wanted))
            if moves:
                with self._cond:
                    for entry, period, wanted in moves:
                        if entry.period != period:
                            continue  # poked meanwhile
                        self._groups[period].remove(entry)
                        if wanted < 0:
                            self._count -= 1
                            self._named -= entry.cid is not None
                            continue
                        entry.period = wanted
                        self._groups[wanted].append(entry)
                        self._due[wanted] = min(self._due[wanted], now + wanted)
            sweeps = moves = []  # type: ignore[assignment]

    def _to_drive(self) -> Optional[_Entry]:
        """(Under the lock.) A subchannel connecting or waiting to reconnect, if any: see _drive."""
        for period in (FAST, MEDIUM):
            for entry in self._groups[period]:
                if not entry.dead and entry.state != READY:
                    return entry
        return None

    def _drive(self, entry: _Entry, wait: float) -> None:
        """Wait for the next sweep inside a short grpcio watch of a subchannel that is connecting or down, rather
        than on the condition: on grpcio releases whose sync channels do their I/O only while a thread polls
        (1.70), that is what makes the connection attempt (and the reconnection after backoff) progress. It
        never lasts more than DRIVE, and happens only while some subchannel is not READY."""
        try:
            state = entry.read(False)
            if internals.sync_watch_connectivity(entry.channel, state, max(0.0, min(wait, DRIVE))):
                with self._cond:
                    self._due[entry.period] = 0.0  # it changed: read it now
        except ValueError:  # closed
            entry.dead = True

    def _read(self, entry: _Entry, now: float) -> float:
        """Read one entry's state, tell its owner of a change; the period it wants next (-1: drop it)."""
        if entry.drain_until:
            if entry.dead:
                return -1
            try:
                if internals.sync_calls_in_flight(entry.channel) and now < entry.drain_until:
                    return MEDIUM
            except ValueError:
                pass
            entry.dead = True
            internals.close_sync_channel(entry.channel)
            return -1
        owner = entry.owner()
        if entry.dead or owner is None:
            entry.dead = True
            return -1
        seen, entry.seen = entry.seen, -1
        if seen >= 0 and seen != entry.state:  # e.g. IDLE after a GOAWAY, which the attempt has since ended
            entry.state = seen
            entry.links = ()  # a loss seen: the connection it makes next is not news
            try:
                owner.on_state(entry.index, entry.channel, seen)
            except Exception:
                log.exception("grpc_retry: connectivity change failed")
        try:
            state = entry.read(False)
        except ValueError:  # closed
            entry.dead = True
            return -1
        if state != entry.state:
            entry.state = state
            try:
                owner.on_state(entry.index, entry.channel, state)
            except Exception:
                log.exception("grpc_retry: connectivity change failed")
        if state == READY:
            if not entry.used:
                return SLOW
            if now >= entry.check_after and self._remade(entry, now):
                try:
                    owner.on_remade(entry.index, entry.channel)
                except Exception:
                    log.exception("grpc_retry: connectivity change failed")
            return MEDIUM
        entry.links = ()  # a loss seen: the connection it makes next is not news
        if state == CONNECTING or entry.hot_until > now:
            return FAST
        if state == TRANSIENT_FAILURE or (owner.active and owner.eager):
            return MEDIUM
        return SLOW

    def _remade(self, entry: _Entry, now: float) -> bool:
        """Whether a used READY subchannel of a name is on another connection than when last read (channelz)."""
        entry.used = False
        if entry.cid is None:
            return False
        started = perf_counter()
        links = internals.channelz_subchannels(entry.cid)
        self._channelz_cost += (perf_counter() - started - self._channelz_cost) / 8
        entry.check_after = now + max(MEDIUM, self._channelz_cost * self._named / CHANNELZ_BUDGET)
        if links is None:  # closed meanwhile
            return False
        previous, entry.links = entry.links, links
        return bool(previous) and bool(links) and links != previous

    def _after_fork(self) -> None:
        # The thread did not come along; the parent's subchannels are unusable in the child.
        self._cond = threading.Condition(threading.Lock())
        self._groups = {FAST: [], MEDIUM: [], SLOW: []}
        self._count = 0
        self._named = 0
        self._thread = None


POLLER = Poller()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POLLER._after_fork)


class _HealthWatch:
    """A17's watch of one subchannel's backend: a thread, for grpcio's sync API reads a stream only by blocking
    (only channels with healthCheckConfig have them). It ends when stopped: the call is cancelled."""

    def __init__(self, subchannels: SyncSubchannels, index: int, channel: Any, service: str) -> None:
        # Its channel's set, held weakly: a channel dropped without close() is collected, and its finalizer
        # stops the watches (SyncSubchannels).
        self._subchannels = weakref.ref(subchannels)
        self._index, self._channel = index, channel
        self._request = health.request(service)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        threading.Thread(target=self._run, name="grpc_retry-health", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            call = self._call
        if call is not None:
            call.cancel()

    def _tell(self, answer: Optional[bool]) -> None:
        subchannels = self._subchannels()
        if subchannels is not None:
            subchannels.on_health(self._index, self._channel, answer)

    def _run(self) -> None:
        channel = self._channel
        backoff = health.Backoff()
        watch = channel.unary_stream(health.WATCH)
        while True:
            with self._lock:
                if self._stopped.is_set():
                    return
                try:
                    call = self._call = watch(self._request)
                except ValueError:  # its channel closed
                    return
            try:
                for response in call:
                    backoff.answered()
                    self._tell(health.healthy(response))
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
            if self._stopped.is_set():
                return
            if code == grpc.StatusCode.UNIMPLEMENTED:
                subchannels = self._subchannels()
                if subchannels is not None:
                    subchannels.unimplemented.note(subchannels.target.authority)
                self._tell(health.HEALTHY)
                return
            self._tell(health.UNHEALTHY)
            self._stopped.wait(backoff.delay())


def _stop_watches(watches: Dict[int, _HealthWatch]) -> None:
    for watch in list(watches.values()):
        watch.stop()


class SyncSubchannels(Subchannels):
    reads_started = False  # a name's: its attempts tell when they have started (attempt_started)
    _made_cid: Optional[int] = None  # the channelz id of the grpcio channel _make_channel just made

    def __init__(self, *args: Any) -> None:
        self._entries: List[Optional[_Entry]] = []
        self._health_watches: Dict[int, _HealthWatch] = {}
        weakref.finalize(self, _stop_watches, self._health_watches)
        self._retired: List[_Entry] = []
        super().__init__(*args)
        self.reads_started = self._lookup is not None  # see ATTEMPT_READ_EVERY

    @property
    def eager(self) -> bool:
        return self._eager

    def _schedule(self, delay: float, callback: Callable[[], None]) -> Any:
        return TIMERS.schedule(delay, callback, shared=True)  # the channel's, not a call's

    def _make_channel(self, address: str) -> Any:
        if not self.reads_started:
            return internals.new_sync_channel(address, self._options, self._credentials, self._compression)
        channel, self._made_cid = internals.new_sync_channel_with_id(address, self._options, self._credentials,
                                                                     self._compression)
        return channel

    def _watch(self, index: int, channel: grpc.Channel, connect: bool) -> None:
        if connect:
            internals.sync_connectivity(channel, True)
        cid, self._made_cid = self._made_cid, None  # (made just before, under the lock)
        entry = _Entry(self, index, channel, cid)
        while len(self._entries) <= index:
            self._entries.append(None)
        self._entries[index] = entry
        # Hot either way (POLLER.add): read before the attempt it is made for began connecting it, it is still
        # IDLE, and a cold IDLE entry is read next in SLOW: a pick_first channel's first subchannel, READY within a
        # millisecond, would stay IDLE to the picker for 2 s, and calls would go to any other READY one (a hedge's).
        POLLER.add(entry)

    def _watch_health(self, index: int, channel: Any) -> None:
        assert self.health_service is not None
        self._health_watches[index] = _HealthWatch(self, index, channel, self.health_service)

    def _unwatch_health(self, index: int) -> None:
        watch = self._health_watches.pop(index, None)
        if watch is not None:
            watch.stop()

    def _unwatch(self, index: int) -> None:
        if index < len(self._entries):
            entry, self._entries[index] = self._entries[index], None
            if entry is not None:
                POLLER.remove(entry)

    def channel(self, index: int, connect: bool = False) -> Any:
        channel = self._channels[index]
        if channel is None or not self.active or connect:
            return super().channel(index, connect)
        if not self.reads_started:  # addresses given as such: read before the attempt, at most once a millisecond
            # (the channel is published a moment before its entry: another thread's attempt may come between)
            entry = self._entries[index] if index < len(self._entries) else None
            now = monotonic()
            if entry is not None and now >= entry.read_after:
                entry.read_after = now + ATTEMPT_READ_EVERY
                state = self._look(entry)
                if state is not None and state != READY:
                    return channel
        if self.picker.state(index) != READY:
            self._touch(index, channel, False)
        return channel

    def attempt_started(self, index: int) -> None:
        """(A name's subchannels.) An attempt was just started on slot `index`: its state, read now, tells whether
        its connection was lost (see ATTEMPT_READ_EVERY)."""
        entry = self._entries[index] if index < len(self._entries) else None
        if entry is not None:
            if not entry.used:
                entry.used = True
                if entry.period == SLOW:  # busy from now on: read by the poller every MEDIUM (see _remade)
                    POLLER.poke(entry)
            self._look(entry)

    @staticmethod
    def _look(entry: _Entry) -> Optional[int]:
        """An entry's state, read on an attempt's thread (None: closed meanwhile, which the attempt will say). A
        change is the poller's to report (never this caller's thread): under load a lost connection is IDLE only
        until the next attempt reconnects it, too briefly for the poller's own reads."""
        try:
            state: int = entry.read(False)
        except ValueError:
            return None
        if state != entry.state:
            entry.seen = state
            POLLER.poke(entry)
        return state

    def _retire(self, index: int, channel: Any) -> None:
        entry = self._entries[index] if index < len(self._entries) else None
        if entry is None:
            internals.close_sync_channel(channel)
            return
        self._entries[index] = None
        self._retired = [e for e in self._retired if not e.dead] + [entry]
        POLLER.retire(entry)

    def _touch(self, index: int, channel: Any, connect: bool) -> None:
        if connect:
            try:
                internals.sync_connectivity(channel, True)
            except ValueError:  # closed meanwhile
                return
        entry = self._entries[index] if index < len(self._entries) else None
        if entry is not None:
            POLLER.poke(entry)

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
        """Every subchannel closed now, the retired ones too: grpcio's close cancels their calls and returns
        (with the direct transport, nothing waits on a subchannel's connectivity)."""
        with self._lock:
            retired, self._retired = self._retired, []
        for entry in retired:
            if not entry.dead:
                entry.dead = True
                internals.close_sync_channel(entry.channel)
        for channel in self._take_all():
            if channel is not None:
                internals.close_sync_channel(channel)
        self._notify()


def serially(fn: Callable[[], None]) -> None:
    """Run fn on the process's callbacks thread (subscribe() callbacks: the application's code, which may block,
    never runs on the poller)."""
    CALLBACKS.submit(fn)


CALLBACKS = SerialThread("grpc_retry-callbacks")
