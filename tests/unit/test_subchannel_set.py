"""The set of subchannels under random address changes and state changes (hypothesis state machine): a pick never
gives a SHUTDOWN slot, a call's "used" memory never names a slot that now holds another address, vanished slots are
reused so the set stays the size of its largest live address set. The flavor's I/O is replaced by plain objects
here (no grpcio: this is the set's own logic); the churn test at the end runs the real sync flavor."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from grpc_retry import _transport as transport
from grpc_retry._backends import AioSubchannels, SyncSubchannels
from grpc_retry._backends.subchannels import READY, SHUTDOWN, Subchannels
from grpc_retry._backends.sync import POLLER
from grpc_retry._backends.target import Target
from grpc_retry._options import parse_options

POOL = [f"ipv4:10.0.0.{i}:80" for i in range(1, 9)]
STATES = [0, 1, 2, 3]  # IDLE, CONNECTING, READY, TRANSIENT_FAILURE


class _Channel:
    def __init__(self, address: str) -> None:
        self.address = address
        self.closed = False


class ScriptedSubchannels(Subchannels):
    """The set with its I/O replaced: channels are plain objects, watching and kicking are recorded."""

    def __init__(self, lb: str) -> None:
        self.made: List[_Channel] = []
        self.kicked: List[int] = []
        self.scheduled: List[Any] = []  # callbacks due later (the flavors' timers), run by run_scheduled()
        super().__init__("ipv4:10.0.0.1:80", parse_options([("grpc.lb_policy_name", lb)]), None, None)

    def _schedule(self, delay: float, callback: Any) -> Any:
        self.scheduled.append(callback)

    def run_scheduled(self) -> None:
        while self.scheduled:
            self.scheduled.pop(0)()

    def _make_channel(self, address: str) -> Any:
        channel = _Channel(address)
        self.made.append(channel)
        return channel

    def _watch(self, index: int, channel: Any, connect: bool) -> None:
        if connect:
            self.kicked.append(index)

    def _touch(self, index: int, channel: Any, connect: bool) -> None:
        if connect:
            self.kicked.append(index)

    def _retire(self, index: int, channel: Any) -> None:
        channel.closed = True  # (the flavors close it once its calls have ended)


class SubchannelSetMachine(RuleBasedStateMachine):
    @initialize(lb=st.sampled_from(["pick_first", "round_robin"]))
    def start(self, lb: str) -> None:
        self.set = ScriptedSubchannels(lb)
        self.lb = lb
        self.peak = 1
        # Calls: (used mask, picker births when it was last brought up to date, {slot: address used there}).
        self.calls: List[Tuple[int, int, Dict[int, str]]] = []

    @rule(addresses=st.lists(st.sampled_from(POOL), min_size=1, max_size=6, unique=True))
    def resolve(self, addresses: List[str]) -> None:
        self.set._apply(addresses, None)
        self.peak = max(self.peak, len(addresses))

    @rule(data=st.data(), state=st.sampled_from(STATES))
    def change_state(self, data: Any, state: int) -> None:
        live = [slot for slot, ch in enumerate(self.set._channels) if ch is not None]
        if live:
            slot = data.draw(st.sampled_from(live))
            self.set.on_state(slot, self.set._channels[slot], state)

    @rule()
    def time_passes(self) -> None:
        self.set.run_scheduled()  # round_robin: what the first use left to do off its path

    @rule(data=st.data())
    def call_attempts(self, data: Any) -> None:
        """A call picks and uses a few slots (as the call machine does: forget reborn slots, then pick)."""
        picker = self.set.picker
        used, births, where = 0, picker.births, {}
        for _ in range(data.draw(st.integers(1, 3))):
            used = picker.forget(used, births)
            births = picker.births
            slot = picker.pick(used)
            if slot < 0:
                break
            assert picker.state(slot) != SHUTDOWN
            channel = self.set.channel(slot)
            assert channel is not None and not channel.closed
            used |= 1 << slot
            where[slot] = self.set.addresses[slot]
        self.calls.append((used, births, where))

    @precondition(lambda self: self.calls)
    @rule(data=st.data())
    def used_memory_stays_right(self, data: Any) -> None:
        used, births, where = data.draw(st.sampled_from(self.calls))
        now = self.set.picker.forget(used, births)
        for slot in range(self.set.picker.size):
            if (now >> slot) & 1:
                # Still "used": the slot holds the very address this call used there.
                assert self.set.addresses[slot] == where[slot], (slot, where)

    @invariant()
    def consistent(self) -> None:
        s = self.set
        states = s.picker.states()
        assert len(states) == len(s.addresses) == len(s._channels) <= self.peak
        live = s.live_addresses
        assert len(live) == len(set(live))
        for address in live:
            slot = s._slot_of[address, 0]
            assert s.addresses[slot] == address and states[slot] != SHUTDOWN
        for slot in s._parked:
            assert states[slot] == SHUTDOWN and s._channels[slot] is None
        assert all(ch.closed == (ch not in s._channels) for ch in s.made)
        for used, _, _ in self.calls[-3:]:
            slot = s.picker.pick(used)
            assert slot < 0 or states[slot] != SHUTDOWN

    @invariant()
    def round_robin_keeps_every_used_subchannel_connecting(self) -> None:
        if self.lb == "round_robin" and self.set.active and not self.set.scheduled:
            for slot, channel in enumerate(self.set._channels):
                if self.set.picker.state(slot) != SHUTDOWN:
                    assert channel is not None  # made (and kicked) as soon as it resolved, or the set was used


TestSubchannelSet = SubchannelSetMachine.TestCase
TestSubchannelSet.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_round_robin_reconnects_a_subchannel_that_goes_idle() -> None:
    s = ScriptedSubchannels("round_robin")
    s._apply(POOL[:3], None)
    s.channel(0)
    s.run_scheduled()
    assert sorted(set(s.kicked)) == [0, 1, 2]  # first use connects every address (the others off its path)
    s.on_state(1, s._channels[1], READY)
    s.kicked.clear()
    s.on_state(1, s._channels[1], 0)  # GOAWAY: IDLE
    assert s.kicked == [1]


def test_pick_first_leaves_an_idle_subchannel_to_the_next_pick() -> None:
    s = ScriptedSubchannels("pick_first")
    s._apply(POOL[:3], None)
    s.channel(0)
    s.on_state(0, s._channels[0], READY)
    s.kicked.clear()
    s.on_state(0, s._channels[0], 0)
    assert s.kicked == [] and s.picker.pick(0) == 0


def test_ten_thousand_churn_events_keep_the_set_at_its_live_size() -> None:
    """Backends replaced one at a time, 10^4 times, on the real sync flavor (real grpcio channels, made, watched
    and closed): the set keeps 5 slots, the poller 5 entries at most, and no channel is left open."""
    if transport.NAME != "direct":
        pytest.skip("the portable transport follows each sync subchannel with a thread of grpcio's (subscribe()): "
                    "10^4 retired in a burst are 10^4 threads until their grace ends")
    subchannels = SyncSubchannels("ipv4:127.0.0.1:1", parse_options([("grpc.lb_policy_name", "round_robin")]),
                                  None, None)
    rng = random.Random(7)
    live = [f"ipv4:127.0.{i // 250}.{1 + i % 250}:1" for i in range(5)]
    subchannels._apply(live, None)
    subchannels.channel(0)  # in use: round_robin makes and watches every subchannel
    next_address = 5
    try:
        for _ in range(10_000):
            live[rng.randrange(5)] = f"ipv4:127.{1 + next_address // 62500}.{next_address // 250 % 250}." \
                                     f"{1 + next_address % 250}:1"
            next_address += 1
            subchannels._apply(list(live), None)
        assert subchannels.picker.size == 5 and len(subchannels.addresses) == 5
        assert sorted(subchannels.live_addresses) == sorted(live)
        assert sum(channel is not None for channel in subchannels._channels) == 5
        assert len(subchannels._slot_of) <= 10  # live and parked
    finally:
        subchannels.close()
    assert all(channel is None for channel in subchannels._channels)
    until = time.monotonic() + 5.0  # the poller drops closed entries at their group's next sweep
    while POLLER.entries() > 0 and time.monotonic() < until:
        time.sleep(0.05)
    assert POLLER.entries() == 0


def test_an_asyncio_cluster_keeps_the_endpoints_given_after_none() -> None:
    """An xDS cluster's endpoints, assigned none (with its error) and then some at once, on asyncio: the later
    assignment stands. Only a name looked up holds its first failure back; an assignment held back would land
    over the next one and leave the cluster without endpoints."""
    async def scenario() -> None:
        subchannels = AioSubchannels(Target("assigned", "svc", 0, "svc"), parse_options([]), None, None)
        try:
            subchannels.assign([], "cluster 'c' has no endpoints")
            subchannels.assign(["ipv4:127.0.0.1:1"], None)
            for _ in range(100):  # turns of the loop, past any failure held back
                await asyncio.sleep(0)
            assert subchannels.live_addresses == ["ipv4:127.0.0.1:1"]
            assert subchannels.resolution_error is None
        finally:
            await subchannels.close()

    asyncio.run(scenario())
