"""The call machine under hypothesis: calls of random policy and shape, driven by random events in any order a
driver could see them, keep the invariants every call must keep."""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_machine import (
    CANCELLED,
    DEADLINE_EXCEEDED,
    IDLE,
    INF,
    INVALID_ARGUMENT,
    NOT_SENT_DETAILS,
    OK,
    READY,
    REFUSED_DETAILS,
    TRANSIENT_FAILURE,
    UNAVAILABLE,
    names,
    picker,
    pushback,
    retry_info_trailer,
)

from grpc_retry._core import (
    CANCEL,
    COMMIT,
    DELIVER,
    END,
    HALF_CLOSE,
    START,
    TIMER,
    UNWAIT,
    WAIT,
    WRITE,
    BufferPool,
    CallMachine,
    CallPolicy,
    MachineError,
    RetryThrottle,
)

CODES = st.sampled_from([OK, UNAVAILABLE, UNAVAILABLE, INVALID_ARGUMENT, DEADLINE_EXCEEDED])
DETAILS = st.sampled_from(["x", NOT_SENT_DETAILS, REFUSED_DETAILS])
TRAILERS = st.sampled_from([None, None, pushback("10"), pushback("-1"), retry_info_trailer(0, 200_000_000),
                            retry_info_trailer(60, 0)])


class Calls(RuleBasedStateMachine):
    """One call of random policy and shape, driven by random events in any order a driver could see them.
    The test plays the driver: it keeps what the actions said (live attempts, the timer, the wait) and only
    sends events that a driver could send."""

    @initialize(hedged=st.booleans(), max_attempts=st.integers(1, 5), unary=st.booleans(),
                per_rpc=st.sampled_from([3, 10, 1 << 20]), addresses=st.integers(1, 4),
                wait_for_ready=st.booleans(), throttled=st.booleans(), deadline=st.sampled_from([5.0, INF]),
                enabled=st.booleans(), rng=st.floats(0.0, 1.0), recv=st.sampled_from([INF, 0.3]))
    def setup(self, hedged, max_attempts, unary, per_rpc, addresses, wait_for_ready, throttled, deadline, enabled,
              rng, recv):
        if hedged:
            self.policy = CallPolicy(max_attempts, retryable_codes=(UNAVAILABLE,), hedging_delay=0.5)
        else:
            self.policy = CallPolicy(max_attempts, 0.2, 1.0, 2.0, (UNAVAILABLE,), recv_timeout=recv)
        self.pool = BufferPool(1 << 20)
        self.picker = picker(addresses)
        self.machine = CallMachine(self.policy, RetryThrottle(3000, 500) if throttled else None, self.pool,
                                   self.picker, per_rpc, deadline, lambda: rng, enabled, wait_for_ready, unary)
        self.max_attempts = max_attempts if enabled else 1
        self.unary = unary
        self.now = 0.0
        self.live: Set[int] = set()
        self.writing: Dict[int, bool] = {}
        self.closed: Set[int] = set()
        self.timer: float = INF
        self.waiting: Optional[int] = None
        self.ended: List[tuple] = []
        self.committed_to: Optional[int] = None
        self.previous_counts: Set[int] = set()
        self.used: Set[int] = set()
        self.half_closed = unary
        self.ending = None
        self.apply(self.machine.start(self.now, b"req" if unary else None))

    # -- playing the driver --

    def apply(self, actions):
        for i, action in enumerate(actions):
            kind = action[0]
            assert not self.ended, f"{names(actions)} after the end"
            if kind == START:
                n, address, previous = action[1:]
                # Nothing starts after commit, but the one that will carry a committed call.
                if self.committed_to is not None:
                    assert not self.live and actions[i + 1] == (COMMIT, n)
                self.check_pick(address)
                self.used.add(address)
                self.live.add(n)
                self.writing[n] = False
                self.previous_counts.add(previous)
                assert previous < self.max_attempts
            elif kind == WRITE:
                n = action[1]
                assert n in self.live and not self.writing[n] and n not in self.closed
                self.writing[n] = True
            elif kind == HALF_CLOSE:
                # Once, after every message's WRITE (maybe with the last still going out): none comes after it
                assert action[1] in self.live and action[1] not in self.closed
                self.closed.add(action[1])
            elif kind == CANCEL:
                self.live.remove(action[1])
            elif kind == COMMIT:
                self.committed_to = action[1]
                assert action[1] in self.live or action[1] == self.ending
            elif kind == TIMER:
                self.timer = action[1]
            elif kind == WAIT:
                assert self.waiting is None
                self.waiting = action[1]
            elif kind == UNWAIT:
                assert self.waiting is not None
                self.waiting = None
            elif kind in (DELIVER, END):
                assert i == len(actions) - 1, "the end comes last"
                self.ended.append(action)

    def check_pick(self, address):
        """The picker never reuses an address while an unused one could take the attempt."""
        if address in self.used:
            for i, state in enumerate(self.picker.states()):
                if i not in self.used:
                    assert state not in (READY, IDLE, 1), f"reused {address} while {i} was {state}"

    def event(self, fn, *args):
        self.apply(fn(*args))

    def tick(self, dt):
        self.now += dt

    # -- events --

    @precondition(lambda self: not self.ended and self.live)
    @rule(data=st.data(), code=CODES, details=DETAILS, trailing=TRAILERS, dt=st.floats(0, 0.3),
          headers=st.booleans(), response=st.booleans())
    def status(self, data, code, details, trailing, dt, headers, response):
        n = data.draw(st.sampled_from(sorted(self.live)))
        self.tick(dt)
        self.live.discard(n)
        self.ending = n  # a status with headers commits to the attempt that is ending
        self.event(self.machine.status, n, code, details, trailing, self.now, headers and code != OK,
                   response and code == OK)
        self.ending = None

    @precondition(lambda self: not self.ended and self.live)
    @rule(data=st.data(), kind=st.sampled_from(["message", "headers", "empty headers"]))
    def answer(self, data, kind):
        n = data.draw(st.sampled_from(sorted(self.live)))
        if kind == "empty headers":
            self.event(self.machine.headers, n, self.now, True)
        else:
            self.event(getattr(self.machine, kind), n, self.now)

    @precondition(lambda self: not self.ended and any(self.writing.get(n) for n in self.live))
    @rule(data=st.data())
    def wrote(self, data):
        n = data.draw(st.sampled_from(sorted(n for n in self.live if self.writing[n])))
        self.writing[n] = False
        self.event(self.machine.wrote, n, self.now)

    @precondition(lambda self: not self.ended and not self.half_closed)
    @rule(size=st.integers(1, 4))
    def send(self, size):
        self.event(self.machine.send_message, b"m" * size, self.now)

    @precondition(lambda self: not self.ended and not self.half_closed)
    @rule()
    def half_close(self):
        self.half_closed = True
        self.event(self.machine.half_close, self.now)

    @precondition(lambda self: not self.ended and self.timer != INF)
    @rule()
    def timer_fires(self):
        self.now = max(self.now, self.timer)
        self.timer = INF
        self.event(self.machine.timer, self.now)

    @precondition(lambda self: not self.ended)
    @rule(data=st.data(), state=st.sampled_from([READY, IDLE, TRANSIENT_FAILURE]))
    def subchannel(self, data, state):
        index = data.draw(st.integers(0, self.picker.size - 1))
        self.picker.set_state(index, state)
        self.picker.generation += 1
        if self.waiting is not None:
            self.waiting = None
            self.event(self.machine.subchannels_changed, self.now)

    @precondition(lambda self: not self.ended)
    @rule(dt=st.floats(0, 1))
    def cancel(self, dt):
        self.tick(dt)
        self.event(self.machine.cancel, CANCELLED, self.now)

    @precondition(lambda self: bool(self.ended))
    @rule()
    def nothing_after_the_end(self):
        with pytest.raises(MachineError):
            self.machine.cancel(CANCELLED, self.now)

    # -- invariants --

    @invariant()
    def ends_once_and_leaves_nothing(self):
        if not hasattr(self, "machine"):
            return
        assert len(self.ended) <= 1
        assert self.machine.counted <= self.max_attempts
        assert self.live == {n for n in range(self.machine.attempts) if n in self.live}
        assert self.machine.live == len(self.live)
        if self.ended:
            assert self.machine.state_name == "DONE"
            assert not self.live and self.timer == INF and self.waiting is None
            assert self.pool.used == 0 and self.machine.buffered == 0
            assert self.machine.reason_name
        else:
            assert self.pool.used == self.machine.buffered
            if not self.live and self.waiting is None:
                assert self.timer != INF, "a call with nothing live and nothing to wait for must have a timer"

    def teardown(self):
        if hasattr(self, "machine") and not self.ended:
            # Whatever state it is in, the call can still be ended.
            self.event(self.machine.cancel, CANCELLED, self.now + 100)
            assert len(self.ended) == 1 and self.pool.used == 0


TestCalls = Calls.TestCase
TestCalls.settings = settings(max_examples=400, stateful_step_count=40, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
