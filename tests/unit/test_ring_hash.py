"""ring_hash (gRFC A42): XXH64, the ring as gRPC's C-core builds it, the picks on it (the first attempt where
gRPC's ring_hash sends the call, each retry or hedge to the next endpoint on the ring the call has not used), the
request hash of an xDS route's hash policies, and the service config's ring_hash_experimental."""

from __future__ import annotations

import bisect
import math
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpc_retry._config import parse_service_config
from grpc_retry._core import RING_HASH, RING_SIZE_CAP, Picker, Ring, xxh64

IDLE, CONNECTING, READY, TRANSIENT_FAILURE = 0, 1, 2, 3


@pytest.mark.parametrize("data, expected", [
    (b"", 0xEF46DB3751D8E999),
    (b"a", 0xD24EC4F1A98C6E5B),
    (b"as", 0x1C330FB2D66BE179),
    (b"asd", 0x631C37CE72A97393),
    (b"asdf", 0x415872F599CEA71E),
    (b"Call me Ishmael. Some years ago--never mind how long precisely-", 0x02A2E85470D6FD96),
])
def test_xxh64_gives_the_reference_values(data: bytes, expected: int) -> None:
    assert xxh64(data) == expected


def test_xxh64_agrees_with_the_xxhash_library_on_every_length() -> None:
    xxhash = pytest.importorskip("xxhash")
    rng = random.Random(7)
    for n in range(0, 200):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert xxh64(data) == xxhash.xxh64_intdigest(data), n
        assert xxh64(data, 12345) == xxhash.xxh64_intdigest(data, 12345), n


def counts(ring: Ring) -> dict:
    seen: dict = {}
    for _, slot in ring.entries():
        seen[slot] = seen.get(slot, 0) + 1
    return seen


def test_the_ring_has_each_endpoint_by_its_weight_as_grpc_counts() -> None:
    # Three equal weights: the lightest share (1/3) times the minimum size, rounded up, over that share.
    assert counts(Ring([("127.0.0.1:1", 1, 0), ("127.0.0.1:2", 1, 1), ("127.0.0.1:3", 1, 2)])) == \
        {0: 342, 1: 342, 2: 342}
    # Weights 3, 3, 4: scale ceil(0.3 * 1024) / 0.3; each endpoint the running total's ceiling less the last's.
    assert counts(Ring([("a:1", 3, 0), ("a:2", 3, 1), ("a:3", 4, 2)])) == {0: 308, 1: 308, 2: 411}
    # Sizes are cut to the cap; a weight of 0 counts as 1.
    assert sum(counts(Ring([("a:1", 1, 0), ("a:2", 0, 1)], 10_000, 100_000)).values()) == RING_SIZE_CAP
    ring = Ring([("127.0.0.1:8080", 1, 5)], 1, 1)
    assert ring.entries() == [(xxh64(b"127.0.0.1:8080_0"), 5)]


def test_the_ring_is_sorted_and_a_hash_reaches_the_first_entry_at_or_after_it() -> None:
    ring = Ring([(f"10.0.0.{i}:80", 1 + i % 3, i) for i in range(10)])
    entries = ring.entries()
    hashes = [h for h, _ in entries]
    assert hashes == sorted(hashes)
    rng = random.Random(1)
    for _ in range(1000):
        h = rng.getrandbits(64)
        i = bisect.bisect_left(hashes, h)
        assert ring.start(h) == entries[0 if i == len(entries) else i][1]
    assert ring.start(hashes[3]) == entries[3][1] and ring.start(hashes[-1] + 1) == entries[0][1]


def test_a_thousand_endpoints_make_a_ring_in_fifty_milliseconds() -> None:
    endpoints = [(f"10.{i // 250}.{i % 250}.1:8080", 1 + i % 5, i) for i in range(1000)]
    took = math.inf
    for _ in range(3):
        started = time.perf_counter()
        ring = Ring(endpoints)
        took = min(took, time.perf_counter() - started)
    assert took <= 0.050, took
    assert set(counts(ring)) == set(range(1000))


def picker(states: list, ring: Ring) -> Picker:
    p = Picker(RING_HASH, len(states))
    for i, state in enumerate(states):
        p.set_state(i, state)
    p.ring = ring
    return p


def test_a_pick_starts_where_the_hash_falls_and_skips_failing_endpoints() -> None:
    ring = Ring([(f"10.0.0.{i}:80", 1, i) for i in range(4)], 4, 4)
    entries = ring.entries()
    order = [slot for _, slot in entries]  # one entry each
    h = entries[1][0]
    p = picker([READY] * 4, ring)
    assert p.pick(0, h) == order[1]
    p.set_state(order[1], TRANSIENT_FAILURE)
    assert p.pick(0, h) == order[2]  # the next on the ring
    p.set_state(order[2], IDLE)
    assert p.pick(0, h) == order[2]  # an IDLE one takes it (and connects), as gRPC's picker asks it to
    # A retry goes to the next endpoint the call has not used; once every one is used, the first that can take it.
    assert p.pick(1 << order[2], h) == order[3]
    assert p.pick((1 << order[2]) | (1 << order[3]), h) == order[0]
    assert p.pick(0b1111, h) == order[2]
    for slot in range(4):
        p.set_state(slot, TRANSIENT_FAILURE)
    assert p.pick(0, h) == -1


@settings(max_examples=50, deadline=None)
@given(weights=st.lists(st.integers(1, 20), min_size=1, max_size=12), seed=st.integers(0, 2**32))
def test_retries_walk_the_ring_through_every_endpoint_once(weights: list, seed: int) -> None:
    ring = Ring([(f"10.0.0.{i}:80", w, i) for i, w in enumerate(weights)])
    p = picker([READY] * len(weights), ring)
    h = random.Random(seed).getrandbits(64)
    used = 0
    seen = []
    for _ in weights:
        slot = p.pick(used, h)
        seen.append(slot)
        used |= 1 << slot
    assert sorted(seen) == list(range(len(weights)))
    assert seen[0] == ring.start(h)


def test_each_endpoints_share_of_random_hashes_follows_its_weight() -> None:
    weights = [1, 2, 3, 4]
    ring = Ring([(f"10.0.0.{i}:80", w, i) for i, w in enumerate(weights)])
    rng = random.Random(3)
    hits = [0] * 4
    for _ in range(20_000):
        hits[ring.start(rng.getrandbits(64))] += 1
    for i, w in enumerate(weights):
        assert abs(hits[i] / 20_000 - w / 10) < 0.04, hits


def test_the_service_config_asks_for_ring_hash_with_its_sizes() -> None:
    config = parse_service_config('{"loadBalancingConfig": [{"ring_hash_experimental": {"minRingSize": 64}}]}')
    assert config.lb_policy == "ring_hash" and config.ring_sizes == (64, 4096)
    with pytest.raises(ValueError, match=r"ring_hash_experimental.maxRingSize: cannot be smaller than minRingSize"):
        parse_service_config('{"loadBalancingConfig": [{"ring_hash_experimental": '
                             '{"minRingSize": 100, "maxRingSize": 10}}]}')
    with pytest.raises(ValueError, match=r"minRingSize: must be 1 to 8388608"):
        parse_service_config('{"loadBalancingConfig": [{"ring_hash_experimental": {"minRingSize": 0}}]}')
