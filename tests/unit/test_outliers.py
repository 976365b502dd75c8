"""Outlier detection (gRFC A50) without I/O: the picker's ejected tier and per-slot counts, the detector's two
algorithms, its cap, its ejection times, and the config with every field and its errors."""

from __future__ import annotations

import json
from typing import Any, List, Optional, Tuple

import pytest

from grpc_retry._backends.outliers import OutlierDetector
from grpc_retry._config import (
    FailurePercentageEjection,
    OutlierDetection,
    ServiceConfigError,
    SuccessRateEjection,
    parse_service_config,
)
from grpc_retry._core import PICK_FIRST, ROUND_ROBIN, Picker

READY, IDLE, TF, SHUTDOWN = 2, 0, 3, 4


def picker(states: List[int], policy: int = PICK_FIRST) -> Picker:
    p = Picker(policy, len(states))
    for i, s in enumerate(states):
        p.set_state(i, s)
    return p


def test_an_ejected_slot_is_the_last_resort():
    p = picker([READY, READY, READY])
    p.eject(0, True)
    assert p.pick(0) == 1                       # no first attempt there
    assert p.pick(0b010) == 2                   # a retry goes to an unused one
    assert p.pick(0b110) == 1                   # ... or a used one, rather than the ejected one
    p.set_state(1, TF)
    p.set_state(2, TF)
    assert p.pick(0) == 0                       # nothing else can take it: there, rather than fail
    p.eject(0, False)
    assert p.ejected_count == 0 and p.pick(0b110) == 0


def test_an_ejected_slot_is_forgotten_when_reborn():
    p = picker([READY, READY])
    p.eject(1, True)
    p.reborn(1)
    assert not p.is_ejected(1) and p.ejected_count == 0


def test_counts_are_per_slot_and_taken_once():
    p = picker([READY, READY])
    p.counting = True
    assert p.take_counts() == [(0, 0), (0, 0)]


class CountedPicker:
    """A real picker whose take_counts() returns what the test says the attempts did (the call machine's own
    counting is the integration tests' job)."""

    def __init__(self, n: int) -> None:
        self.real = picker([READY] * n, ROUND_ROBIN)
        self.counts: List[Tuple[int, int]] = [(0, 0)] * n

    def take_counts(self) -> List[Tuple[int, int]]:
        counts, self.counts = self.counts, [(0, 0)] * len(self.counts)
        return counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class FakeSubchannels:
    """What the detector needs of the subchannel set: the picker, addresses, and set_ejected."""

    def __init__(self, n: int) -> None:
        self.picker = CountedPicker(n)
        self.addresses = [f"10.0.0.{i}:443" for i in range(n)]
        self.connections = 1

    def set_ejected(self, slot: int, ejected: bool) -> None:
        self.picker.eject(slot, ejected)


class Sweeper:
    def __init__(self, config: OutlierDetection, n: int, rng: float = 0.0) -> None:
        self.now = 0.0
        self.subchannels = FakeSubchannels(n)
        self.detector = OutlierDetector(config, self.subchannels, lambda d, f: None,  # type: ignore[arg-type]
                                        rng=lambda: rng, clock=lambda: self.now)

    def sweep(self, counts: Optional[List[Tuple[int, int]]], at: float) -> List[int]:
        """Counts (ok, failed) per slot for the interval ending at `at`; the ejected slots after the sweep."""
        self.now = at
        picker = self.subchannels.picker
        if counts:
            picker.counts = counts
        self.detector.sweep()
        return [i for i in range(picker.size) if picker.is_ejected(i)]


FAILURE = OutlierDetection(interval=1, base_ejection_time=10, max_ejection_time=25, max_ejection_percent=50,
                           failure_percentage=FailurePercentageEjection(threshold=50, minimum_hosts=3,
                                                                        request_volume=10))


def test_failure_percentage_ejects_over_the_threshold_with_enough_volume():
    s = Sweeper(FAILURE, 4)
    assert s.sweep([(10, 0), (10, 0), (4, 6), (0, 9)], at=1) == [2]  # 60% failed; 9 calls: too few to judge
    assert s.detector.counts["ejections_enforced_failure_percentage"] == 1


def test_ejection_time_grows_with_the_multiplier_and_is_capped():
    s = Sweeper(FAILURE, 4)
    bad = [(10, 0), (10, 0), (10, 0), (0, 10)]
    assert s.sweep(bad, at=0) == [3]
    assert s.sweep(None, at=9.9) == [3] and s.sweep(None, at=10) == []      # 10 s × 1
    assert s.sweep(bad, at=11) == [3]
    assert s.sweep(None, at=30.9) == [3] and s.sweep(None, at=31) == []     # 10 s × 2
    assert s.sweep(bad, at=32) == [3]
    assert s.sweep(None, at=56.9) == [3] and s.sweep(None, at=57) == []     # min(10 s × 3, 25 s)


def test_the_multiplier_decays_while_not_ejected():
    s = Sweeper(FAILURE, 4)
    bad = [(10, 0), (10, 0), (10, 0), (0, 10)]
    s.sweep(bad, at=0)
    s.sweep(None, at=10)                      # back; multiplier 1 → 0 at the next sweeps
    s.sweep(None, at=11)
    assert s.sweep(bad, at=12) == [3]
    assert s.sweep(None, at=22) == []         # 10 s × 1 again, not × 2


def test_max_ejection_percent_is_checked_before_each_ejection():
    s = Sweeper(FAILURE, 4)
    assert s.sweep([(10, 0), (0, 10), (0, 10), (0, 10)], at=1) == [1, 2]  # 0% and 25% < 50%; 50% stops
    assert s.detector.counts["ejections_overflow"] == 1


def test_enforcement_percentage_is_a_chance():
    config = OutlierDetection(failure_percentage=FailurePercentageEjection(
        threshold=50, minimum_hosts=3, request_volume=10, enforcement_percentage=30), max_ejection_percent=50)
    assert Sweeper(config, 3, rng=0.29).sweep([(10, 0), (10, 0), (0, 10)], at=1) == [2]
    missed = Sweeper(config, 3, rng=0.30)
    assert missed.sweep([(10, 0), (10, 0), (0, 10)], at=1) == []
    assert missed.detector.counts["ejections_detected_failure_percentage"] == 1


def test_success_rate_ejects_the_statistical_outlier():
    config = OutlierDetection(max_ejection_percent=20, success_rate=SuccessRateEjection(
        stdev_factor=1000, minimum_hosts=5, request_volume=10))
    s = Sweeper(config, 6)
    # mean 0.85, stdev ~0.07: 0.7 is under mean - 1.0 × stdev, 0.9 is not
    assert s.sweep([(90, 10)] * 5 + [(70, 30)], at=1) == [5]
    assert Sweeper(config, 6).sweep([(90, 10)] * 3 + [(70, 30)] + [(1, 0)] * 2, at=1) == []  # 4 with volume


def test_no_algorithm_means_no_counting():
    assert not OutlierDetection().counting


# -- config ----------------------------------------------------------------------------------------------------


def od(**fields: Any) -> str:
    fields.setdefault("childPolicy", [{"round_robin": {}}])
    return json.dumps({"loadBalancingConfig": [{"outlier_detection_experimental": fields}]})


def test_every_field_is_read():
    config = parse_service_config(od(
        interval="2s", baseEjectionTime="3s", maxEjectionTime="40s", maxEjectionPercent=20,
        successRateEjection={"stdevFactor": 1500, "enforcementPercentage": 90, "minimumHosts": 4,
                             "requestVolume": 30},
        failurePercentageEjection={"threshold": 70, "enforcementPercentage": 80, "minimumHosts": 2,
                                   "requestVolume": "7"},
        childPolicy=[{"grpclb": {}}, {"pick_first": {}}]))
    assert config.lb_policy == "pick_first"
    assert config.outlier_detection == OutlierDetection(
        2.0, 3.0, 40.0, 20, SuccessRateEjection(1500, 90, 4, 30), FailurePercentageEjection(70, 80, 2, 7))


def test_defaults_are_a50s():
    config = parse_service_config(od(baseEjectionTime="400s", successRateEjection={}))
    assert config.outlier_detection == OutlierDetection(
        interval=10.0, base_ejection_time=400.0, max_ejection_time=400.0, max_ejection_percent=10,
        success_rate=SuccessRateEjection(1900, 100, 5, 100))


@pytest.mark.parametrize("fields, error", [
    ({"interval": "-1s"}, "interval: must not be negative"),
    ({"baseEjectionTime": "1"}, 'baseEjectionTime: invalid duration'),
    ({"maxEjectionTime": "-0.5s"}, "maxEjectionTime: must not be negative"),
    ({"maxEjectionPercent": 101}, "maxEjectionPercent: must be at most 100"),
    ({"maxEjectionPercent": -1}, "maxEjectionPercent: must be in [0, 4294967295]"),
    ({"successRateEjection": {"enforcementPercentage": 101}}, "successRateEjection.enforcementPercentage: must be"),
    ({"successRateEjection": {"stdevFactor": 1.5}}, "successRateEjection.stdevFactor: must be an integer"),
    ({"successRateEjection": []}, "successRateEjection: must be an object"),
    ({"failurePercentageEjection": {"threshold": 200}}, "failurePercentageEjection.threshold: must be at most 100"),
    ({"failurePercentageEjection": {"requestVolume": "x"}}, "failurePercentageEjection.requestVolume: must be"),
    ({"childPolicy": None}, "childPolicy: is required"),
    ({"childPolicy": [{"grpclb": {}}]}, "childPolicy: no supported policy"),
    ({"childPolicy": [{"outlier_detection_experimental": {"childPolicy": [{"round_robin": {}}]}}]},
     "childPolicy: outlier_detection_experimental cannot be its own child"),
])
def test_errors_name_the_field(fields: Any, error: str):
    with pytest.raises(ServiceConfigError) as raised:
        parse_service_config(od(**fields))
    assert any(e.startswith("loadBalancingConfig[0].outlier_detection_experimental.") and error in e
               for e in raised.value.errors), raised.value.errors


def test_unknown_fields_are_warned():
    config = parse_service_config(od(intervall="1s", failurePercentageEjection={"treshold": 1}))
    assert any("intervall: unknown key, ignored (did you mean 'interval'?)" in w for w in config.warnings)
    assert any("treshold: unknown key, ignored (did you mean 'threshold'?)" in w for w in config.warnings)
