"""The set of a channel's subchannels: one grpcio channel per resolved address and connection (C-core's retries
off; `grpc_retry.connections_per_address`, each then in grpcio's local subchannel pool so that it is a
connection of its own), in slots the compiled picker chooses from, living as C-core's subchannels do.

- Slots. An address keeps its slot while it is resolved. One that vanishes is closed and its slot parked
  (SHUTDOWN); if it comes back before the slot is reused it gets the same slot, and calls still remember using it.
  A new address takes the oldest parked slot (reborn: calls forget they used it, picker.pyx.pxi), else a new one,
  so a channel whose backends churn for weeks stays the size of its largest live set.
- Lifecycle. Under round_robin every subchannel connects once the channel is first used, and one that goes IDLE
  (GOAWAY, graceful shutdown, idle timeout) is reconnected at once; under pick_first it reconnects on the next
  pick (the attempt connects it). A subchannel in TRANSIENT_FAILURE keeps reconnecting with gRPC's backoff: its
  grpcio channel does that itself.
- Re-resolution. A `dns:` name is looked up again whenever a subchannel leaves READY or fails to connect, and
  every `dns_refresh` seconds; the lookups are shared with the process's other channels (resolution.py).
- Health (health.py) and outliers (outliers.py). A connected subchannel whose backend is not SERVING is
  TRANSIENT_FAILURE to the picker; an ejected one is its last resort (and, several connections per address, is
  closed, and opened anew when it returns).

The flavors (sync.py, aio.py) make and watch the grpcio channels and run the health watches; this module decides.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic
from typing import Any, Callable, Collection, Dict, List, Optional, Tuple, Union

import grpc

from grpc_retry._backends import health
from grpc_retry._backends.outliers import OutlierDetector
from grpc_retry._backends.resolution import Lookup, shared_lookup
from grpc_retry._backends.target import Target, parse_target, proxied, whole
from grpc_retry._core import PICK_FIRST, RING_HASH, ROUND_ROBIN, Picker, Ring
from grpc_retry._options import RetryOptions

log = logging.getLogger("grpc_retry")

IDLE = 0
CONNECTING = 1
READY = 2
TRANSIENT_FAILURE = 3
SHUTDOWN = 4
# The longest a subchannel whose address vanished waits for its attempts in flight before it is closed.
RETIRE_GRACE = 60.0
# round_robin: after its first call's pick, a channel makes and connects its other subchannels CONNECT_STEP at a
# time, CONNECT_PAUSE apart (meanwhile its calls run: the GIL is theirs too).
CONNECT_STEP = 8
CONNECT_PAUSE = 0.001
# A channel whose name does not resolve learns it no sooner than this after its first use. The system's resolver
# can refuse a name within microseconds (or a lookup shared with another channel can be ending), where grpcio's
# channel asks a DNS server through its event engine: a call cancelled or written to right after it began must find
# itself still running, as on grpcio, not failed already.
FAILURE_NO_SOONER = 0.02
SCHEDULE_SIZE = 4096  # the longest weighted schedule (slots by weight): finer weights are rounded


_PICK_FIRST_FAILING = "failed to connect to all addresses; "
_ROUND_ROBIN_FAILING = "connections to all backends failing; "


_POLICIES = {"round_robin": ROUND_ROBIN, "ring_hash": RING_HASH, "pick_first": PICK_FIRST}


def schedule(weights: List[Tuple[int, float]]) -> List[int]:
    """Slots, each about as often as its weight says (at most SCHEDULE_SIZE entries in all), spread evenly."""
    total = sum(weight for _, weight in weights)
    least = min(weight for _, weight in weights)
    scale = 1 / least if total / least <= SCHEDULE_SIZE else SCHEDULE_SIZE / total
    turns = [((k + 0.5) / count, slot) for slot, weight in weights
             for count in (max(1, round(weight * scale)),) for k in range(count)]
    return [slot for _, slot in sorted(turns)]


def retries_configured(options: RetryOptions) -> bool:
    """Whether the channel's service config gives any method a retry or hedging policy."""
    return any(config.retry_policy is not None or config.hedging_policy is not None
               for config in options.service_config.method_configs.values())


class Subchannels:
    def __init__(self, target: Union[str, Target], options: RetryOptions,
                 credentials: Optional[grpc.ChannelCredentials], compression: Optional[grpc.Compression]) -> None:
        if isinstance(target, Target):  # ("assigned": the addresses come from the channel's resolver, assign())
            self.target = target
        else:
            self.target = parse_target(target)
        if isinstance(target, str) and proxied(self.target, target, options.passthrough):
            self.target = whole(target)  # the proxy is to see the name: grpcio's channel resolves it, as ever
        self._credentials = credentials
        self.secure = credentials is not None
        self._compression = compression
        # Each address has `connections` slots, one per connection: keys (address, k), 0 <= k < connections.
        self.connections = options.connections_per_address
        self._options = self._subchannel_options(options)
        self.refresh = options.dns_refresh
        self.min_interval = options.dns_min_interval
        self.picker = Picker(_POLICIES.get(options.lb_policy, PICK_FIRST), 0)
        self._ring_sizes = options.service_config.ring_sizes
        self._weights: Optional[Dict[str, float]] = None  # an assigned target's, by address (None: even)
        # round_robin spreads over every address, so it keeps them all connected (as grpc's does); pick_first
        # connects one at a time, in order.
        self._eager = options.lb_policy == "round_robin"
        # How a grpcio channel with this LB policy words a call that found no backend to take it (grpc_details),
        # and what the maker adds to those words (e.g. the node ID of the control plane that gave the addresses).
        self.failing_words = _ROUND_ROBIN_FAILING if self._eager else _PICK_FIRST_FAILING
        self.failing_note = ""
        # What a whole target's channel adds to the words of grpcio's failures (its maker sets it), or None.
        self.explain: Optional[Callable[[str], str]] = None
        self.active = False       # first used: from then on, round_robin keeps every subchannel connected
        self._connecting = False  # try_to_connect asked for a connection and none is READY yet
        self.addresses: List[str] = []           # per slot: its address (a parked slot: the one it had)
        self._keys: List[Tuple[str, int]] = []   # per slot: its (address, connection)
        self._slot_of: Dict[Tuple[str, int], int] = {}  # (address, connection) -> slot, live or parked
        self._parked: List[int] = []             # slots whose address vanished, oldest first
        self._channels: List[Any] = []           # per slot: its grpcio channel, or None
        self._lock = threading.RLock()
        self._listeners: List[Callable[[], None]] = []   # one-shot: waiters for the next change
        self._watchers: List[Callable[[], None]] = []    # persistent: connectivity subscribers
        self.resolution_error: Optional[str] = None
        self.closed = False
        self._lookup: Optional[Lookup] = None
        config = options.service_config.outlier_detection
        self.outliers = None if config is None else OutlierDetector(config, self, self._schedule)
        # A17: the service each connected subchannel watches (None: no health checking).
        self.health_service = health.service_name(options.service_config.health_check_service,
                                                  dict(options.passthrough))
        self._health: List[Optional[bool]] = []  # per slot: its backend's last answer (health.UNANSWERED...)
        self._connected: List[bool] = []         # per slot: its grpcio channel is READY (watched for health)
        self.unimplemented = health.Unimplemented()
        self._looked_up = False  # as grpcio's, the channel looks its name up when first used, not when made
        self._used_at = 0.0
        if self.target.scheme == "dns":
            self._lookup = shared_lookup(self.target)
        elif self.target.scheme != "assigned":
            self._apply(list(self.target.addresses), None)

    def _subchannel_options(self, options: RetryOptions) -> List[Tuple[str, Any]]:
        extra: List[Tuple[str, Any]] = [("grpc.enable_retries", 0)]
        if self.target.scheme == "whole" and options.enable_retries and not retries_configured(options):
            # One grpcio channel for the whole target, whose resolver may configure retries of its own (a
            # route's retry policy, gRFC A44): with no policy of grpc_retry's to apply, C-core's stay on. One layer
            # retries, never two.
            extra = []
        if self.connections > 1:
            # grpcio's channels to one address with the same arguments share one subchannel (its global pool):
            # each of ours must be a connection of its own.
            extra.append(("grpc.use_local_subchannel_pool", 1))
        if self.target.scheme == "whole":  # one grpcio channel, for the target itself: its authority is grpcio's
            return list(options.passthrough) + extra
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

    def look_up(self) -> None:
        """Look the name up now (an xDS aggregate's LOGICAL_DNS leaf: its addresses serve the aggregate)."""
        self._look_up()

    def _look_up(self) -> None:
        """First use (a call waits for a backend, or a connect is asked for): look the name up. Not at creation:
        a channel made and not used stays IDLE, and a name that does not resolve fails the first call no
        sooner than grpcio's would."""
        if self._lookup is None or self._looked_up:
            return
        with self._lock:
            if self._looked_up or self.closed:
                return
            self._looked_up = True
            self._used_at = monotonic()
        self._lookup.subscribe(self)

    @property
    def resolved(self) -> bool:
        return bool(self._slot_of) or self.resolution_error is not None

    @property
    def generation(self) -> int:
        """Bumped on every change: a waiter that read it before looking at the states cannot miss a change."""
        return self.picker.generation

    @property
    def live_addresses(self) -> List[str]:
        return list(dict.fromkeys(a for (a, _), slot in self._slot_of.items() if self.picker.state(slot) != SHUTDOWN))

    def failing(self, addresses: Collection[str]) -> bool:
        """Whether every subchannel of `addresses` (a set or dict: looked up per slot) is in TRANSIENT_FAILURE (a
        priority to fail over from)."""
        slots = [slot for (a, _), slot in list(self._slot_of.items()) if a in addresses]
        return bool(slots) and all(self.picker.state(slot) == TRANSIENT_FAILURE for slot in slots)

    def on_resolution(self, addresses: List[str], error: Optional[str]) -> None:
        """A lookup's answer (on the resolver thread): the flavor applies it where it makes subchannels."""
        self._apply(addresses, error)

    def assign(self, addresses: List[str], error: Optional[str], weights: Optional[Dict[str, float]] = None) -> None:
        """An assigned target's addresses (its cluster's endpoints), given where the flavor makes subchannels (the
        resolver's thread, or the channel's event loop), and each one's share of the calls (None: even)."""
        with self._lock:
            self.picker.set_schedule(None)
            self._weights = weights
        self._apply(addresses, error)
        if weights is not None and len(set(weights.values())) > 1:
            with self._lock:
                self.picker.set_schedule(schedule([(slot, weights[address]) for (address, _), slot
                                                   in self._slot_of.items() if address in weights]))

    def _apply(self, addresses: List[str], error: Optional[str]) -> None:
        # (Only a name looked up waits: an assignment applies at once, in order, or a later one would be undone.)
        if error and not self.resolved and self._lookup is not None:
            early = self._used_at + FAILURE_NO_SOONER - monotonic()
            if self._hold_failure(early, lambda: self._apply_now(addresses, error)):
                return
        self._apply_now(addresses, error)

    def _apply_now(self, addresses: List[str], error: Optional[str]) -> None:
        new: List[int] = []
        with self._lock:
            if self.closed:
                return
            if addresses or self.target.scheme == "assigned":  # (an empty assignment is one too)
                self.resolution_error = None if addresses else error
                wanted = dict.fromkeys((a, k) for a in addresses for k in range(self.connections))
                for key, slot in self._slot_of.items():
                    if key not in wanted and self.picker.state(slot) != SHUTDOWN:
                        self._park(slot)
                for key in wanted:
                    slot = self._slot_of.get(key, -1)
                    if slot >= 0 and self.picker.state(slot) != SHUTDOWN:
                        continue
                    new.append(self._place(key, slot))
                if self.picker.policy == RING_HASH:
                    self.picker.ring = self._ring(addresses)
            elif not self.live_addresses:
                self.resolution_error = error
            self.picker.resolved = self.resolved
            start = self.active and self._eager
        if error and self._lookup is not None and not self.live_addresses:
            self._lookup.reresolve(self)  # nothing to connect to: look again when the interval allows
        if start:
            for slot in new:
                self.channel(slot, connect=True)
        elif self._connecting:
            self._connect_next()  # a connect asked for before the name resolved
        self._notify()

    def _ring(self, addresses: List[str]) -> Ring:
        """(Under the lock.) The ring of the addresses, in their resolver's order, each keyed by its "host:port" and
        weighed by its weight (ring.pyx.pxi)."""
        weights = self._weights or {}
        return Ring([(address.split(":", 1)[1] if address.startswith(("ipv4:", "ipv6:")) else address,
                      weights.get(address, 1.0), self._slot_of[(address, 0)]) for address in addresses],
                    *self._ring_sizes)

    def _park(self, slot: int) -> None:
        """The slot's address vanished: SHUTDOWN (no new attempt goes there); its channel is retired."""
        self.picker.set_state(slot, SHUTDOWN)
        self._parked.append(slot)
        channel, self._channels[slot] = self._channels[slot], None
        self._drop_health(slot)
        if channel is not None:
            self._retire(slot, channel)

    def _place(self, key: Tuple[str, int], parked: int) -> int:
        """A slot for a new (or returning) connection to an address, IDLE."""
        if parked >= 0:  # back before its slot was reused: calls still remember it
            self._parked.remove(parked)
            self.picker.set_state(parked, IDLE)
            return parked
        if self._parked:
            slot = self._parked.pop(0)
            del self._slot_of[self._keys[slot]]
            self.addresses[slot], self._keys[slot] = key[0], key
            self.picker.reborn(slot)
        else:
            slot = len(self.addresses)
            self.addresses.append(key[0])
            self._keys.append(key)
            self._channels.append(None)
            self._health.append(health.UNANSWERED)
            self._connected.append(False)
            self.picker.resize(slot + 1)
        self._slot_of[key] = slot
        return slot

    # -- subchannels ------------------------------------------------------------------------------------

    def channel(self, index: int, connect: bool = False) -> Any:
        """The grpcio channel of slot `index`, made on first use; `connect`: make it connect now."""
        channel = self._channels[index]
        if channel is None or not self.active:
            return self._first_use(index, connect)
        if connect or self.picker.state(index) != READY:
            self._touch(index, channel, connect)
        return channel

    def _first_use(self, index: int, connect: bool) -> Any:
        with self._lock:
            if self.closed:
                raise self._closed_error()
            activate, self.active = not self.active, True
            channel = self._channels[index]
            if channel is None and self.picker.state(index) == SHUTDOWN:
                # Its address vanished between the pick and now (a lookup on another thread): the attempt goes
                # to the subchannel a fresh pick gives, rather than fail.
                other = self.picker.pick(0)
                if other < 0:
                    raise ValueError("no subchannel left to start the attempt on")
                index, channel = other, self._channels[other]
            if channel is None:
                channel = self._channels[index] = self._make_channel(self.addresses[index])
                self._watch(index, channel, connect)
                connect = False
        if connect:
            self._touch(index, channel, True)
        if activate:
            if self.outliers is not None:
                self.outliers.start()
            if self._eager:
                # The others connect off this attempt's path, a step at a time: making a subchannel is a grpcio
                # channel (~50 us), and the first call of a channel of 300 addresses is not to wait for them all.
                self._schedule(0.0, self._connect_all)
        return channel

    def _connect_all(self, done: int = 0) -> None:
        """round_robin: make and connect every subchannel, CONNECT_STEP at a time (between steps the event loop,
        or the GIL, is the calls')."""
        slots = list(self._slot_of.values())[done:done + CONNECT_STEP]
        for slot in slots:
            if self.closed:
                return
            if self.picker.state(slot) != SHUTDOWN:
                try:
                    self.channel(slot, connect=True)
                except Exception:
                    if self.closed:  # closed meanwhile, on another thread
                        return
                    raise
        if len(slots) == CONNECT_STEP and not self.closed:
            self._schedule(CONNECT_PAUSE, lambda: self._connect_all(done + CONNECT_STEP))

    def on_state(self, index: int, channel: Any, state: int) -> None:
        """Slot `index`'s grpcio channel `channel` is now in `state` (the flavor's watcher tells)."""
        with self._lock:
            if self._channels[index] is not channel:
                return  # closed or replaced since
            previous = self.picker.state(index)
            if self.health_service is not None:
                if state == READY and not self._connected[index]:
                    self._connected[index] = True
                    self._health[index] = health.UNANSWERED
                    self._watch_health(index, channel)
                elif state != READY and self._connected[index]:
                    self._connected[index] = False
                    self._unwatch_health(index)
            self.picker.set_state(index, self._with_health(index, state))
        if state == READY:
            self._connecting = False
        elif state == TRANSIENT_FAILURE and self._connecting:
            self._connect_next()
        if state == IDLE and self._eager and self.active and not self.closed:
            self._touch(index, channel, True)  # round_robin: a subchannel that lost its connection reconnects
        if self._lookup is not None and state != previous and (previous == READY or state == TRANSIENT_FAILURE):
            self._lookup.reresolve(self)  # a backend lost, or unreachable: has the name moved?
        self._notify()

    def on_remade(self, index: int, channel: Any) -> None:
        """Slot `index`'s grpcio channel `channel` lost its connection and made another between two reads of its
        state (the flavor's watcher tells): as for any loss, the name is looked up again."""
        if self._lookup is not None and self._channels[index] is channel and not self.closed:
            self._lookup.reresolve(self)

    def _with_health(self, index: int, state: int) -> int:
        """A17: a connected subchannel is READY only while its backend says SERVING."""
        if state != READY or self.health_service is None:
            return state
        answer = self._health[index]
        return CONNECTING if answer is health.UNANSWERED else READY if answer else TRANSIENT_FAILURE

    def _drop_health(self, index: int) -> None:
        """(Under the lock.) Slot `index`'s channel is taken out: its health watch ends."""
        if self._connected[index]:
            self._connected[index] = False
            self._unwatch_health(index)
        self._health[index] = health.UNANSWERED

    def on_health(self, index: int, channel: Any, answer: Optional[bool]) -> None:
        """Slot `index`'s backend answered its health watch (the flavor's watcher tells)."""
        with self._lock:
            if self._channels[index] is not channel or not self._connected[index]:
                return
            if self._health[index] == answer:
                return
            self._health[index] = answer
            self.picker.set_state(index, self._with_health(index, READY))
        self._notify()

    def set_ejected(self, index: int, ejected: bool) -> None:
        """Outlier detection ejects slot `index`, or returns it. Behind one address (several connections per
        address) an ejected connection is closed, and opened anew when it returns: the balancer places it again."""
        with self._lock:
            if self.closed or self.picker.state(index) == SHUTDOWN:
                return
            self.picker.eject(index, ejected)
            if ejected and self.connections > 1:
                channel, self._channels[index] = self._channels[index], None
                self._drop_health(index)
                if channel is not None:
                    self._retire(index, channel)
                self.picker.set_state(index, IDLE)
            start = not ejected and self.active and self._eager
        if start:
            try:
                self.channel(index, connect=True)
            except ValueError:  # closed meanwhile
                pass
        self._notify()

    # -- waiting for a change ---------------------------------------------------------------------------

    def when_changed(self, since: int, listener: Callable[[], None], use: bool = True) -> bool:
        """Call `listener` once at the next change, unless generation already moved past `since`
        (then False, and nothing is registered: the caller looks again). A call waiting (`use`) is a first use;
        a connectivity watch is not."""
        with self._lock:
            if self.generation != since:
                return False
            self._listeners.append(listener)
        if use:
            self._look_up()
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
        states = [s for s in self.picker.states() if s != SHUTDOWN]
        if not states and self.resolution_error is not None:
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        for value, state in ((READY, grpc.ChannelConnectivity.READY),
                             (CONNECTING, grpc.ChannelConnectivity.CONNECTING)):
            if value in states:
                return state
        if states and all(s == TRANSIENT_FAILURE for s in states):
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        return grpc.ChannelConnectivity.IDLE

    def connect(self) -> None:
        """try_to_connect: start the subchannel the picker would use first and, as grpcio's pick_first does,
        the next one each time one fails, until one is READY (round_robin: all of them)."""
        self._connecting = True
        self._look_up()
        self._connect_next()

    def _connect_next(self) -> None:
        if self._slot_of and not self.closed:
            index = self.picker.pick(0)
            if index >= 0 and self.picker.state(index) == IDLE:
                try:
                    self.channel(index, connect=True)
                except ValueError:  # closed meanwhile
                    pass

    def _notify(self) -> None:
        # Watchers first: one may change the addresses (a priority failing over), which the calls waiting
        # for a subchannel are then told of, rather than of a state they would fail on.
        with self._lock:
            self.picker.generation += 1
            watchers = list(self._watchers)
        for listener in watchers:
            try:
                listener()
            except Exception:
                log.exception("subchannel listener failed")
        with self._lock:
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            try:
                listener()
            except Exception:
                log.exception("subchannel listener failed")

    def unavailable_details(self) -> str:
        """A call that fails fast, finding no connection to try: in grpcio's words, with the last connection error
        an attempt met here (the target's name when none has)."""
        if self.resolution_error:
            return self.resolution_error
        last = self.picker.last_error
        if last is not None:
            return self.failing_details(last)
        return f"failed to connect to all addresses of {self.target.authority!r}"

    def failing_details(self, details: str) -> str:
        """An attempt's status details, where a subchannel found no connection (pick_first's words: a grpcio
        channel on one address), as this channel's LB policy words them."""
        if self.explain is not None:
            details = self.explain(details)
        if not details.startswith(_PICK_FIRST_FAILING):
            return details
        return f"{self.failing_words}{details[len(_PICK_FIRST_FAILING):]}{self.failing_note}"

    def _take_all(self) -> List[Any]:
        """Closing: every grpcio channel, taken out; no more lookups."""
        with self._lock:
            self.closed = True
            channels, self._channels = self._channels, [None] * len(self._channels)
            for slot in range(len(channels)):
                self._drop_health(slot)
                self._unwatch(slot)
        if self.outliers is not None:
            self.outliers.close()
        if self._lookup is not None:
            self._lookup.unsubscribe(self)
        return channels

    # -- flavor hooks -----------------------------------------------------------------------------------

    def _make_channel(self, address: str) -> Any:
        raise NotImplementedError

    def _watch(self, index: int, channel: Any, connect: bool) -> None:
        """Watch slot `index`'s new grpcio channel (and start connecting it if `connect`)."""
        raise NotImplementedError

    def _unwatch(self, index: int) -> None:
        """Slot `index`'s channel is gone (under the lock)."""

    def _watch_health(self, index: int, channel: Any) -> None:
        """(Under the lock.) Start watching the health of slot `index`'s backend (health.py)."""
        raise NotImplementedError

    def _unwatch_health(self, index: int) -> None:
        """(Under the lock.) Stop watching it: disconnected, closed or retired."""

    def _retire(self, index: int, channel: Any) -> None:
        """(Under the lock.) Slot `index`'s address vanished: close its channel once the attempts in flight on it
        have ended (at most RETIRE_GRACE later), as C-core lets a removed subchannel's calls finish."""
        raise NotImplementedError

    def _touch(self, index: int, channel: Any, connect: bool) -> None:
        """An attempt is going to slot `index`, which is not READY (or `connect`: make it connect)."""
        raise NotImplementedError

    def _schedule(self, delay: float, callback: Callable[[], None]) -> Any:
        """Run `callback` in `delay` seconds where this flavor acts (a handle with cancel())."""
        raise NotImplementedError

    def _hold_failure(self, early: float, apply: Callable[[], None]) -> bool:
        """Whether the name's first failure waits (`apply` runs when it is due): `early` seconds are left of
        FAILURE_NO_SOONER."""
        if early <= 0:
            return False
        self._schedule(early, apply)
        return True

    def _closed_error(self) -> Exception:
        return ValueError("Cannot invoke RPC on closed channel!")
