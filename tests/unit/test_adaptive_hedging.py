"""Adaptive hedging in the core: the quantile estimate against known distributions (within one bucket), its
adaptation after a step change, the floor, the extra-load budget, and the machine's use of both."""

from __future__ import annotations

import math
import random

import pytest

from grpc_retry._core import BUCKET_ERROR, CallMachine, CallPolicy, HedgingControl, Picker
from grpc_retry._core import BufferPool as Pool
from grpc_retry._options import parse_options

TOLERANCE = BUCKET_ERROR * 1.25  # one bucket, and the sampling noise of 20,000 samples


def quantile(samples, q):
    ordered = sorted(samples)
    return ordered[int(q * len(ordered))]


@pytest.mark.parametrize("draw", [
    lambda rng: rng.expovariate(1 / 0.010),
    lambda rng: rng.lognormvariate(math.log(0.002), 0.8),
    lambda rng: rng.uniform(0.001, 0.050),
    lambda rng: 0.100 if rng.random() < 0.05 else rng.uniform(0.0008, 0.0012),  # a 5% slow tail
], ids=["exponential", "lognormal", "uniform", "bimodal"])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.95])
def test_the_estimate_is_within_a_bucket_of_the_quantile(draw, q):
    rng = random.Random(1)
    control = HedgingControl(0.0, q)
    samples = [draw(rng) for _ in range(20_000)]
    for i, latency in enumerate(samples):
        control.record(latency, i * 1e-5)  # 0.2 s in all: no decay to speak of
    true = quantile(samples, q)
    # A quantile that falls on a jump of the distribution may sit a bucket either side of it.
    assert abs(control.estimate(0.2) / true - 1) <= TOLERANCE or \
        quantile(samples, q - 0.005) <= control.estimate(0.2) <= quantile(samples, q + 0.005) * (1 + TOLERANCE)


def test_the_estimate_follows_a_step_change_within_seconds():
    rng = random.Random(2)
    control = HedgingControl(0.0, 0.95)
    now = 0.0
    while now < 10:  # 200 samples a second around 10 ms
        control.record(rng.uniform(0.008, 0.012), now)
        now += 0.005
    before = control.estimate(now)
    assert abs(before / 0.0118 - 1) <= TOLERANCE
    step = now
    while control.estimate(now) < 0.0236 / (1 + TOLERANCE):  # latency doubles
        control.record(rng.uniform(0.016, 0.024), now)
        now += 0.005
        assert now - step < 5, "the estimate did not follow within 5 s"


def test_the_config_delay_is_the_floor_and_the_fallback():
    control = HedgingControl(0.050, 0.95)
    assert control.delay(0.0) == 0.050  # no sample yet
    for i in range(10):
        control.record(0.001, i * 0.001)
    assert control.estimate(0.01) == -1 and control.delay(0.01) == 0.050  # too few samples
    for i in range(100):
        control.record(0.001, 0.01 + i * 0.001)
    assert control.estimate(0.2) < 0.050 and control.delay(0.2) == 0.050  # below the floor
    for i in range(1000):
        control.record(0.2, 0.2 + i * 0.001)
    assert control.delay(1.3) > 0.15


def test_samples_fade_with_age():
    control = HedgingControl(0.0, 0.5)
    for _ in range(100):
        control.record(0.001, 0.0)
    assert control.estimate(0.0) < 0.002
    assert control.estimate(30.0) == -1  # 100 samples 30 s old weigh less than one today


def machine(policy, addresses=3):
    picker = Picker(1, 0)
    picker.resize(addresses)
    for i in range(addresses):
        picker.set_state(i, 2)
    picker.resolved = True
    return CallMachine(policy, None, Pool(1 << 20), picker, 1 << 20, math.inf, random.random, True, False, True)


def hedge_policy(control):
    return CallPolicy(max_attempts=3, retryable_codes=(14,), hedging_delay=0.01, hedge=control)


def test_the_budget_allows_at_most_its_share_of_hedges():
    control = HedgingControl(0.01, 0.0, 0.05)
    policy = hedge_policy(control)
    hedges = 0
    wanted = 0
    for i in range(1000):  # every call slow: each wants two hedges
        m = machine(policy)
        m.start(i, b"x")
        for k in (1, 2):
            if m.timer_at != math.inf:
                wanted += 1
                m.timer(i + 0.01 * k)
        hedges += m.counted - 1
        m.cancel(1, i + 0.03)
    assert 0.05 * 1000 - 1 <= hedges <= 0.05 * 1000 + 50  # the share, plus the full bucket it started with
    assert 900 < control.budget_stopped <= wanted - hedges  # (a timer a hair early only re-arms)


def test_a_call_over_budget_goes_on_with_its_attempts_and_says_why():
    control = HedgingControl(0.01, 0.0, 0.0)  # no extra load at all (an empty bucket)
    m = machine(hedge_policy(control))
    actions = m.start(0.0, b"x")
    assert [a[0] for a in actions].count(0) == 1  # START: the first attempt
    assert not [a for a in m.timer(0.01) if a[0] == 0]  # the hedge is not sent
    assert control.budget_stopped == 1 and m.live == 1
    m.status(0, 14, "down", None, 0.02)
    assert m.reason_name == "hedge_budget"


def test_the_machine_hedges_after_the_adaptive_delay_and_learns_from_answers():
    control = HedgingControl(0.001, 0.95)
    policy = hedge_policy(control)
    for i in range(100):  # answers after 20 ms, one call every 25 ms
        m = machine(policy)
        m.start(i * 0.025, b"x")
        m.headers(0, i * 0.025 + 0.020)
        m.status(0, 0, None, None, i * 0.025 + 0.021)
    m = machine(policy)
    actions = m.start(2.5, b"x")
    timers = [a[1] for a in actions if a[0] == 5]
    assert timers and abs((timers[0] - 2.5) / 0.020 - 1) <= TOLERANCE


def test_defaults_keep_a6_and_bad_values_raise():
    assert parse_options([]).hedging_quantile == 0 and parse_options([]).max_extra_load < 0
    options = parse_options([("grpc_retry.hedging_quantile", 0.95), ("grpc_retry.max_extra_load", 0.05)])
    assert (options.hedging_quantile, options.max_extra_load) == (0.95, 0.05)
    for name, value in [("grpc_retry.hedging_quantile", 1.0), ("grpc_retry.hedging_quantile", 0),
                        ("grpc_retry.hedging_quantile", "0.9"), ("grpc_retry.max_extra_load", -0.1)]:
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            parse_options([(name, value)])
