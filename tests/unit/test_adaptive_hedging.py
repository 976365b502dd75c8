"""Adaptive hedging in the core: the quantile estimate against known distributions (within one bucket), its
adaptation after a step change, the floor, a rare method's memory, censored samples and the edge of a gap, the
extra-load budget, the machine's use of both, a closed loop through the machine in simulated time, and hypothesis
on the budget and the estimate's bounds."""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpc_retry._core import (
    BUCKET_ERROR,
    CANCEL,
    COMMIT,
    DELIVER,
    END,
    KEEP,
    START,
    START_CALLS,
    TIMER,
    CallMachine,
    CallPolicy,
    HedgingControl,
    Picker,
)
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


def test_older_samples_fade_but_a_rare_method_keeps_its_last_answers():
    control = HedgingControl(0.0, 0.5)
    for i in range(30):  # one call every 10 s: time alone would leave nothing to go by
        control.record(0.005, i * 10.0)
    assert abs(control.estimate(300.0) / 0.005 - 1) <= TOLERANCE
    # An hour later, new answers take over within a few KEEP of them, each fading the old by at most 1/KEEP.
    now = 3900.0
    for _ in range(20):
        control.record(0.050, now)
        now += 0.001
    assert control.estimate(now) < 0.010
    for _ in range(int(3 * KEEP)):
        control.record(0.050, now)
        now += 0.001
    assert abs(control.estimate(now) / 0.050 - 1) <= TOLERANCE


def fast(rng):
    return rng.uniform(0.0010, 0.0020)


def test_censored_samples_count_at_their_age():
    # 15% of attempts were cut short at 20 ms by a hedge: a slow share well past the 5% the quantile leaves.
    control = HedgingControl(0.0, 0.95)
    rng = random.Random(3)
    for i in range(1000):
        if i % 20 < 3:
            control.record_censored(0.020, i * 1e-4)
        else:
            control.record(fast(rng), i * 1e-4)
    assert control.estimate(0.1) >= 0.020 / (1 + TOLERANCE)  # left out, it would be ~2 ms
    answered, censored = control.histogram()  # kept apart from the answers
    assert max(answered) < 0.0021 and min(censored) > 0.017 and sum(censored.values()) > 0.1 * sum(answered.values())


def test_a_hedge_cancelled_younger_than_the_delay_does_not_count():
    control = HedgingControl(0.005, 0.5)  # the delay is at least 5 ms
    rng = random.Random(4)
    for i in range(200):
        control.record(fast(rng), i * 1e-4)
        control.record_censored(0.001, i * 1e-4)  # a hedge that lost 1 ms after it started
    assert control.estimate(0.1) > 0.0014  # the median of the answers, not of answers and losers


@pytest.mark.parametrize("hedged", [True, False], ids=["hedged", "answered"])
def test_on_the_edge_of_a_gap_the_estimate_is_the_fast_answers_top(hedged):
    """A slow share as big as the tail share puts the 0.95 quantile anywhere in the gap between the fast answers
    and the slow ones (answered at 100 ms, or hedged: cut short at the delay plus a fast answer): the estimate
    takes the fast answers' top, whichever side of 5% the slow share falls. A slow share well beyond it is real:
    the estimate goes up to the slow answers, or up the censored samples."""
    for share, fast_top in [(0.040, True), (0.055, True), (0.070, True), (0.15, False)]:
        control = HedgingControl(0.0, 0.95)
        rng = random.Random(5)
        for i in range(4000):
            now = i * 1e-4
            if rng.random() >= share:
                control.record(fast(rng), now)
            elif hedged:
                control.record_censored(control.delay(now) + fast(rng), now)
            else:
                control.record(0.100, now)
        estimate = control.estimate(0.4)
        if fast_top:
            assert 0.0019 <= estimate <= 0.0020 * (1 + TOLERANCE), (share, estimate)
        else:
            assert estimate >= (0.004 if hedged else 0.100 / (1 + TOLERANCE)), (share, estimate)


def machine(policy, addresses=3, rand=random.random):
    picker = Picker(1, 0)
    picker.resize(addresses)
    for i in range(addresses):
        picker.set_state(i, 2)
    picker.resolved = True
    return CallMachine(policy, None, Pool(1 << 20), picker, 1 << 20, math.inf, rand, True, False, True)


def hedge_policy(control):
    return CallPolicy(max_attempts=3, retryable_codes=(14,), hedging_delay=0.01, hedge=control)


def test_the_budget_allows_at_most_its_share_of_hedges():
    control = HedgingControl(0.01, 0.0, 0.05)
    policy = hedge_policy(control)
    hedges = 0
    wanted = 0
    for i in range(1000):  # every call slow: each wants two hedges; all within one window
        t = i * 0.005
        m = machine(policy)
        m.start(t, b"x")
        for k in (1, 2):
            if m.timer_at != math.inf:
                wanted += 1
                m.timer(t + 0.01 * k)
        hedges += m.counted - 1
        m.cancel(1, t + 0.03)
    # The share of the calls, and of those the window starts with.
    assert 0.05 * (1000 + START_CALLS) - 1 <= hedges <= 0.05 * (1000 + START_CALLS)
    assert 900 < control.budget_stopped <= wanted - hedges  # (a timer a hair early only re-arms)


def test_the_share_is_of_the_calls_of_the_last_interval():
    control = HedgingControl(0.01, 0.0, 0.05)
    policy = hedge_policy(control)
    sent = []
    for i in range(3000):  # ten calls a second, each wanting a hedge: past the first interval, one in twenty
        t = i * 0.1
        m = machine(policy)
        m.start(t, b"x")
        if m.timer_at != math.inf:
            m.timer(t + 0.01)
        sent.append(m.counted - 1)
        m.cancel(1, t + 0.02)
    assert sum(sent[:100]) == 0.05 * (100 + START_CALLS)  # the first interval: with the calls it starts with
    late = sum(sent[1000:])
    assert 0.05 * 2000 - 2 <= late <= 0.05 * 2000 + 1, late


def test_a_call_over_budget_goes_on_with_its_attempts_and_says_why():
    control = HedgingControl(0.01, 0.0, 0.0)  # no extra load at all
    m = machine(hedge_policy(control))
    actions = m.start(0.0, b"x")
    assert [a[0] for a in actions].count(START) == 1  # the first attempt
    assert not [a for a in m.timer(0.01) if a[0] == START]  # the hedge is not sent
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
    timers = [a[1] for a in actions if a[0] == TIMER]
    assert timers and abs((timers[0] - 2.5) / 0.020 - 1) <= TOLERANCE


def test_an_answer_told_with_its_status_teaches_as_headers_do():
    # asyncio's hedged unary attempts tell a response with its status (`response`): the same sample, the same
    # commit before the end.
    delays = []
    for answer_with_status in (False, True):
        control = HedgingControl(0.001, 0.95)
        policy = hedge_policy(control)
        for i in range(100):  # answers after 20 ms, one call every 25 ms
            m = machine(policy)
            m.start(i * 0.025, b"x")
            if answer_with_status:
                actions = m.status(0, 0, None, None, i * 0.025 + 0.020, False, True)
                assert [a[0] for a in actions if a[0] in (COMMIT, DELIVER)] == [COMMIT, DELIVER]
            else:
                m.headers(0, i * 0.025 + 0.020)
                m.status(0, 0, None, None, i * 0.025 + 0.020)
        delays.append(control.delay(2.5))
    assert abs(delays[0] / 0.020 - 1) <= TOLERANCE and delays[1] == delays[0]


# -- a closed loop: calls through the real machine, in simulated time ---------------------------------------------


def closed_loop(control, seconds, latency, in_flight=1, seed=0):
    """`in_flight` calls at a time, each started as the last ends, through the call machine with `control`; each
    attempt answers (headers, then OK) `latency(rng, now)` seconds after it starts. Returns the calls (start,
    latency), the delay every 0.1 s (time, delay), and the attempts started."""
    rng = random.Random(seed)
    policy = CallPolicy(max_attempts=3, retryable_codes=(14,), hedging_delay=control.floor, hedge=control)
    events, calls, done, trace, attempts = [], {}, [], [], [0]
    serial = iter(range(1 << 62))

    def act(call, actions, now):
        machine, live, _, start = calls[call]
        for action in actions:
            if action[0] == START:
                attempts[0] += 1
                live[action[1]] = next(serial)
                heapq.heappush(events, (now + latency(rng, now), live[action[1]], call, action[1]))
            elif action[0] == CANCEL:
                live.pop(action[1], None)
            elif action[0] == TIMER and action[1] != math.inf:
                calls[call][2] = next(serial)
                heapq.heappush(events, (action[1], calls[call][2], call, -1))
            elif action[0] in (DELIVER, END):
                done.append((start, now - start))
                del calls[call]
                begin(now)
                return

    def begin(now):
        call = next(serial)
        calls[call] = [machine(policy, rand=rng.random), {}, None, now]
        act(call, calls[call][0].start(now, b"x"), now)

    for _ in range(in_flight):
        begin(0.0)
    while events[0][0] < seconds:
        now, key, call, n = heapq.heappop(events)
        while len(trace) * 0.1 <= now:
            trace.append((len(trace) * 0.1, control.delay(len(trace) * 0.1)))
        if call not in calls:
            continue
        m, live, timer, _ = calls[call]
        if n < 0 and key == timer:
            act(call, m.timer(now), now)
        elif n >= 0 and live.get(n) == key:
            actions = m.headers(n, now)
            act(call, actions + (m.status(n, 0, None, None, now) if call in calls and n in live else []), now)
    return done, trace, attempts[0]


def test_in_a_closed_loop_the_delay_holds_at_the_fast_answers_top_and_follows_a_step():
    """The bench's world, simulated: answers in ~1 ms (a short exponential tail), 5% in 100 ms, with 0.95 and a
    5% budget; at 12 s every latency doubles."""
    def latency(rng, now):
        scale = 2.0 if now >= 12 else 1.0
        return scale * (0.100 if rng.random() < 0.05 else rng.uniform(0.0009, 0.0014) + rng.expovariate(5000))

    for seed in range(3):
        control = HedgingControl(0.0, 0.95, 0.05)
        calls, trace, attempts = closed_loop(control, 25, latency, seed=seed)
        steady = [d for t, d in trace if 4 <= t < 12]
        # The fast answers' top: p99.7 of 0.9-1.4 ms plus an exponential of mean 0.2 ms is ~2.6 ms.
        assert 0.0018 <= min(steady) and max(steady) <= 0.0036, seed
        steady_calls = sorted(latency for start, latency in calls if 4 <= start < 12)
        assert steady_calls[int(0.99 * len(steady_calls))] < 0.010  # the tail is cut: p99 is no slow answer
        assert attempts / len(calls) <= 1.06
        was = median(trace, 10, 12)
        # Within 5 s the delay has moved with the bulk of the answers (the last of the way, the tail above the
        # delay, shows only as fast as hedges stop cutting it short); then it settles at about twice.
        assert median(trace, 16, 17) >= 1.3 * was, seed
        assert 1.5 * was <= median(trace, 20, 25) <= 2.5 * was, seed


def median(trace, start, end):
    window = sorted(d for t, d in trace if start <= t < end)
    return window[len(window) // 2]


# -- hypothesis -----------------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(load=st.floats(0.01, 0.5), wanted=st.lists(st.integers(0, 2), min_size=1, max_size=200))
def test_any_run_of_calls_keeps_to_the_budget(load, wanted):
    control = HedgingControl(0.01, 0.0, load)
    policy = hedge_policy(control)
    sent = 0
    for i, hedges in enumerate(wanted):
        m = machine(policy)
        m.start(i, b"x")
        for k in range(1, hedges + 1):
            if m.timer_at != math.inf:
                m.timer(i + 0.01 * k)
        assert m.counted - 1 <= hedges
        sent += m.counted - 1
        m.cancel(1, i + 0.5)
    assert sent <= load * (len(wanted) + START_CALLS) + 1e-9
    assert control.budget_stopped <= sum(wanted) - sent


@settings(max_examples=100, deadline=None)
@given(samples=st.lists(st.floats(1e-4, 10.0), min_size=25, max_size=300), q=st.floats(0.5, 0.99),
       censored=st.lists(st.floats(1e-4, 10.0), max_size=30))
def test_the_estimate_stays_within_what_was_seen(samples, q, censored):
    control = HedgingControl(0.0, q)
    for i, latency in enumerate(samples):
        control.record(latency, i * 1e-3)
    for age in censored:
        control.record_censored(age, len(samples) * 1e-3)
    seen = samples + censored  # (a censored sample counts only if older than the delay then)
    estimate = control.estimate(len(samples) * 1e-3)
    assert min(seen) / (1 + BUCKET_ERROR) <= estimate <= max(seen) * (1 + BUCKET_ERROR)


def test_defaults_keep_a6_and_bad_values_raise():
    assert parse_options([]).hedging_quantile == 0 and parse_options([]).max_extra_load < 0
    options = parse_options([("grpc_retry.hedging_quantile", 0.95), ("grpc_retry.max_extra_load", 0.05)])
    assert (options.hedging_quantile, options.max_extra_load) == (0.95, 0.05)
    for name, value in [("grpc_retry.hedging_quantile", 1.0), ("grpc_retry.hedging_quantile", 0),
                        ("grpc_retry.hedging_quantile", "0.9"), ("grpc_retry.max_extra_load", -0.1)]:
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            parse_options([(name, value)])
