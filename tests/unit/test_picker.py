"""The compiled picker alone: which address an attempt goes to, given the subchannels' states and the addresses
the call already used (a bit mask)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpc_retry._core import PICK_FIRST, ROUND_ROBIN, Picker

IDLE, CONNECTING, READY, TRANSIENT_FAILURE, SHUTDOWN = range(5)
CONNECTABLE = (IDLE, CONNECTING)


def picker(policy, states):
    p = Picker(policy, len(states))
    for index, state in enumerate(states):
        p.set_state(index, state)
    return p


def used_mask(indices):
    return sum(1 << i for i in indices)


@given(policy=st.sampled_from([PICK_FIRST, ROUND_ROBIN]),
       states=st.lists(st.integers(IDLE, SHUTDOWN), min_size=1, max_size=70),
       data=st.data(), rotations=st.integers(0, 5))
def test_never_a_used_address_while_an_unused_one_is_ready_or_connectable(policy, states, data, rotations):
    p = picker(policy, states)
    for _ in range(rotations):  # round_robin: start the rotation anywhere
        p.pick(0)
    used = data.draw(st.sets(st.integers(0, len(states) - 1)))
    chosen = p.pick(used_mask(used))
    unused_ready = [i for i, s in enumerate(states) if s == READY and i not in used]
    unused_connectable = [i for i, s in enumerate(states) if s in CONNECTABLE and i not in used]
    if unused_ready:
        assert chosen in unused_ready
    elif unused_connectable:
        assert chosen in unused_connectable
    elif any(s == READY for s in states):
        assert states[chosen] == READY  # every live address used: the normal pick, READY first
    elif any(s in CONNECTABLE for s in states):
        assert states[chosen] in CONNECTABLE
    else:
        assert chosen == -1  # nothing can take the attempt: the driver waits or fails it


@given(states=st.lists(st.integers(IDLE, SHUTDOWN), min_size=1, max_size=10))
def test_pick_first_takes_addresses_in_order(states):
    p = picker(PICK_FIRST, states)
    ready = [i for i, s in enumerate(states) if s == READY]
    connectable = [i for i, s in enumerate(states) if s in CONNECTABLE]
    expected = ready[0] if ready else connectable[0] if connectable else -1
    assert p.pick(0) == p.pick(0) == expected  # pick_first does not move on by itself


def test_pick_first_falls_through_addresses_that_cannot_connect():
    p = picker(PICK_FIRST, [TRANSIENT_FAILURE, SHUTDOWN, IDLE, READY])
    assert p.pick(0) == 3
    p.set_state(3, TRANSIENT_FAILURE)
    assert p.pick(0) == 2


def test_round_robin_rotates_over_ready_addresses():
    p = picker(ROUND_ROBIN, [READY, TRANSIENT_FAILURE, READY, READY])
    assert [p.pick(0) for _ in range(6)] == [0, 2, 3, 0, 2, 3]


def test_round_robin_retry_skips_the_used_address_it_would_rotate_to():
    p = picker(ROUND_ROBIN, [READY, READY, READY])
    assert p.pick(0) == 0
    assert p.pick(used_mask([1])) == 2  # the rotation says 1; the call used it


def test_every_address_used_falls_back_to_the_normal_pick():
    p = picker(PICK_FIRST, [CONNECTING, READY, TRANSIENT_FAILURE])
    assert p.pick(used_mask([0, 1, 2])) == 1


def test_nothing_to_pick():
    assert Picker(PICK_FIRST, 0).pick(0) == -1
    p = picker(ROUND_ROBIN, [TRANSIENT_FAILURE, SHUTDOWN])
    assert p.all_failed() and p.pick(0) == -1
    p.set_state(1, IDLE)
    assert not p.all_failed() and p.pick(0) == 1


def test_resize_keeps_indices_and_adds_idle_addresses():
    p = picker(ROUND_ROBIN, [READY, TRANSIENT_FAILURE])
    p.resize(4)
    assert p.states() == [READY, TRANSIENT_FAILURE, IDLE, IDLE] and p.size == 4
    p.resize(1)
    assert p.states() == [READY]


def test_used_mask_beyond_64_addresses():
    p = picker(PICK_FIRST, [READY] * 80)
    assert p.pick(used_mask(range(70))) == 70


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError):
        Picker(7, 1)


def test_round_robin_by_weight_starts_rotations_as_the_schedule_says():
    from grpc_retry._backends.subchannels import schedule

    p = picker(ROUND_ROBIN, [READY, READY, READY])
    p.set_schedule(schedule([(0, 0.6), (1, 0.2), (2, 0.2)]))
    picks = [p.pick(0) for _ in range(500)]
    assert [picks.count(i) for i in range(3)] == [300, 100, 100]
    # A slot used by the call is still skipped, whatever the schedule says.
    assert all(p.pick(1 << 0) != 0 for _ in range(50))
    # A slot that cannot take an attempt gives its turns to the next.
    p.set_state(0, TRANSIENT_FAILURE)
    assert set(p.pick(0) for _ in range(50)) == {1, 2}
    p.set_schedule(None)
    p.set_state(0, READY)
    picks = [p.pick(0) for _ in range(300)]
    assert [picks.count(i) for i in range(3)] == [100, 100, 100]


def test_a_schedule_spreads_each_slots_turns():
    from grpc_retry._backends.subchannels import SCHEDULE_SIZE, schedule

    assert schedule([(0, 3.0), (1, 1.0)]) == [0, 0, 1, 0]
    turns = schedule([(slot, 1.0 + slot % 7) for slot in range(2000)])
    assert len(turns) <= SCHEDULE_SIZE + 2000 and set(turns) == set(range(2000))


def test_load_counts_follow_each_attempt_of_a_call_to_its_end():
    """Load reports: every attempt started is issued and in progress on its slot until it ends, succeeded or
    failed (a hedge cancelled because another answered is failed, as gRPC counts it)."""
    import math
    import random

    from grpc_retry._core import BufferPool, CallMachine, CallPolicy

    picker = Picker(ROUND_ROBIN, 2)
    for slot in range(2):
        picker.set_state(slot, 2)
    picker.loads = True
    policy = CallPolicy(max_attempts=2, retryable_codes=(14,), hedging_delay=0.01)
    m = CallMachine(policy, None, BufferPool(1 << 20), picker, 1 << 20, math.inf, random.random)
    m.start(0.0, b"x")
    m.timer(0.01)  # the hedge
    assert [load[:2] for load in picker.take_loads()] == [(1, 1), (1, 1)]
    m.headers(1, 0.02)
    m.status(1, 0, None, None, 0.02)  # the hedge answers; the first attempt is cancelled
    assert picker.take_loads() == [(0, 0, 0, 1), (0, 0, 1, 0)]
    assert picker.take_loads() == [(0, 0, 0, 0), (0, 0, 0, 0)]
