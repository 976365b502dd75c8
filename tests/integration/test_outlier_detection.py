"""Outlier detection (gRFC A50) over real grpcio servers: a backend that fails every call is ejected from the
first attempts of every call (and from retries while others exist), comes back after its ejection time, and is
ejected for longer if it still fails; at most maxEjectionPercent of the backends are out at once. Behind one L4
address with several connections per address, a connection that landed on the bad backend is ejected, closed and
re-dialled. Both APIs."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, List

import grpc
import pytest
from support.backend import UNARY, Backend, fail
from support.l4 import L4Balancer

import grpc_retry

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)

SERVICE = "grpc_retry.test.Echo"
RETRY = {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
         "retryableStatusCodes": ["UNAVAILABLE"]}


def service_config(max_percent: int = 34, base: str = "1s", **failure: Any) -> str:
    detection = {"interval": "0.1s", "baseEjectionTime": base, "maxEjectionPercent": max_percent,
                 "failurePercentageEjection": {"threshold": 50, "minimumHosts": 3, "requestVolume": 5, **failure},
                 "childPolicy": [{"round_robin": {}}]}
    return json.dumps({"loadBalancingConfig": [{"outlier_detection_experimental": detection}],
                       "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": RETRY}]})


def ipv4(backends: List[Backend]) -> str:
    return "ipv4:" + ",".join(b.target for b in backends)


def run(channel: Any, seconds: float, settle: float) -> Dict[str, float]:
    """Calls one after another for `seconds`; what the calls after the first `settle` seconds did."""
    start = time.monotonic()
    codes, attempts = [], 0
    while time.monotonic() - start < seconds:
        outcome = channel.unary(UNARY, b"x", timeout=10)
        if time.monotonic() - start >= settle:
            codes.append(outcome.code)
            attempts += 1 + int(outcome.previous_attempts or 0)
    return {"calls": len(codes), "success": codes.count(grpc.StatusCode.OK) / len(codes),
            "attempts_per_call": attempts / len(codes)}


def test_a_failing_backend_is_ejected_and_costs_almost_no_attempt(client, backends):
    backends[2].fallback(UNARY, lambda i: fail())
    channel = client.channel(ipv4(backends), [("grpc.service_config", service_config())])
    figures = run(channel, seconds=3.0, settle=1.0)
    assert figures["success"] == 1.0, figures
    assert figures["attempts_per_call"] <= 1.03, figures  # without: ~1.33 (every third call starts there)
    stats = channel.channel.retry_stats().outlier_detection
    assert stats.ejections_enforced_total >= 1 and stats.ejections_enforced_failure_percentage >= 1
    assert stats.ejections_detected_failure_percentage >= stats.ejections_enforced_failure_percentage
    assert len(backends[2].attempts_of(UNARY)) < 0.1 * len(backends[0].attempts_of(UNARY))
    channel.close()


def test_a_backend_comes_back_after_its_ejection_time_and_goes_out_for_longer(client, backends, caplog):
    backends[2].fallback(UNARY, lambda i: fail())
    caplog.set_level(logging.DEBUG, logger="grpc_retry")
    channel = client.channel(ipv4(backends), [("grpc.service_config", service_config(base="0.3s"))])
    run(channel, seconds=2.5, settle=0)
    stats = channel.channel.retry_stats().outlier_detection
    assert stats.unejections >= 1 and stats.ejections_enforced_total >= 2
    assert all(address.endswith(backends[2].target) for address in stats.ejected), stats.ejected
    ejections = [r.getMessage() for r in caplog.records if "outlier detection" in r.getMessage()]
    assert any(backends[2].target in m and "ejected" in m for m in ejections), ejections
    times = [float(m.rsplit("for ", 1)[1].split(" s")[0]) for m in ejections if "ejected" in m]
    # Ejected again while it still fails: for longer. (A50 takes a step off the multiplier at each interval that
    # does not eject it: calls slow enough to give it under requestVolume attempts in the 0.1 s after a return
    # eject it for the base time again, as a run on a loaded machine once did: 0.3, 0.3, 0.6, 0.9 s.)
    assert max(times[1:]) > times[0], times
    channel.close()


def test_max_ejection_percent_caps_the_backends_out(client, backends):
    for bad in backends[1:]:
        bad.fallback(UNARY, lambda i: fail())
    # A50 checks the cap before each ejection: with one of 3 out (33%), 33 stops a second one; 34 would not.
    channel = client.channel(ipv4(backends), [("grpc.service_config", service_config(max_percent=33))])
    figures = run(channel, seconds=2.0, settle=1.0)
    stats = channel.channel.retry_stats().outlier_detection
    assert len(stats.ejected) <= 1 and stats.ejections_overflow >= 1
    assert figures["success"] == 1.0, figures  # the one good backend answers every retry
    channel.close()


def test_without_outlier_detection_nothing_is_counted(client, backends):
    channel = client.channel(ipv4(backends), [("grpc.lb_policy_name", "round_robin")])
    assert channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK
    assert channel.channel.retry_stats().outlier_detection is None
    channel.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_behind_one_address_connections_on_the_bad_backend_are_ejected_and_redialled(client, seed):
    backends = [Backend() for _ in range(3)]
    backends[2].fallback(UNARY, lambda i: fail())
    balancer = L4Balancer([b.target for b in backends], "random", seed=seed)
    try:
        options = [("grpc.service_config", service_config(max_percent=75, minimumHosts=2)),
                   ("grpc_retry.connections_per_address", 4)]
        channel = client.channel(balancer.target, options)
        figures = run(channel, seconds=4.0, settle=2.0)
        assert figures["success"] >= 0.995, figures
        assert figures["attempts_per_call"] <= 1.10, figures
        channel.close()
    finally:
        balancer.close()
        for backend in backends:
            backend.stop()


def test_outlier_detection_config_is_checked_at_creation():
    bad = json.dumps({"loadBalancingConfig": [{"outlier_detection_experimental": {
        "maxEjectionPercent": 150, "childPolicy": [{"round_robin": {}}]}}]})
    with pytest.raises(grpc_retry.ServiceConfigError,
                       match=r"outlier_detection_experimental\.maxEjectionPercent: must be at most 100"):
        grpc_retry.insecure_channel("127.0.0.1:1", options=[("grpc.service_config", bad)])


def test_ejections_are_opentelemetry_counters(backends):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    backends[2].fallback(UNARY, lambda i: fail())
    reader = InMemoryMetricReader()
    options = [("grpc.service_config", service_config()),
               ("grpc_retry.meter_provider", MeterProvider(metric_readers=[reader]))]
    with grpc_retry.insecure_channel(ipv4(backends), options=options) as channel:
        call = channel.unary_unary(UNARY)
        deadline = time.monotonic() + 10
        while channel.retry_stats().outlier_detection.ejections_enforced_total == 0:
            assert time.monotonic() < deadline
            call(b"x", timeout=5)
        got = {metric.name: metric.data.data_points
               for resource in reader.get_metrics_data().resource_metrics
               for scope in resource.scope_metrics for metric in scope.metrics}
    (enforced,) = got["grpc.lb.outlier_detection.ejections_enforced_total"]
    assert enforced.value >= 1 and enforced.attributes == {"grpc.target": ipv4(backends)}
    (detected,) = got["grpc.lb.outlier_detection.ejections_detected_failure_percentage"]
    assert detected.value >= enforced.value
