"""Client-side health checking (gRFC A17) against real grpcio servers running the standard health service
(grpcio-health-checking's): a backend flipped to NOT_SERVING while calls run gets no new call within a second and
no call fails; it is back within 2 s of SERVING. A server without the health service is taken as healthy (and
logged once); `grpc.inhibit_health_checking` turns it off. Both pickers, both APIs."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, List

import grpc
import pytest
from grpc_health.v1 import health_pb2
from support.backend import UNARY, Backend

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)

SERVICE = "grpc_retry.test.Echo"
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def options(lb: str, watched: str = "echo", *extra: Any) -> list:
    config = {"loadBalancingConfig": [{lb: {}}], "healthCheckConfig": {"serviceName": watched}}
    return [("grpc.service_config", json.dumps(config)), *extra]


@pytest.fixture
def healthy_backends():
    backends = [Backend(health=True) for _ in range(3)]
    for backend in backends:
        backend.health.set("echo", SERVING)
    yield backends
    for backend in backends:
        backend.stop()


def target(backends: List[Backend]) -> str:
    return "ipv4:" + ",".join(b.target for b in backends)


class Load:
    """Calls one after another on a thread until stopped; every status kept."""

    def __init__(self, channel: Any) -> None:
        self.codes: List[grpc.StatusCode] = []
        self._stop = threading.Event()
        self._channel = channel
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.codes.append(self._channel.unary(UNARY, b"x", timeout=10).code)

    def stop(self) -> List[grpc.StatusCode]:
        self._stop.set()
        self._thread.join(30)
        return self.codes


def arrived_after(backend: Backend, moment: float) -> int:
    return sum(1 for a in backend.attempts_of(UNARY) if a.arrived > moment)


def wait_until(condition: Any, timeout: float) -> float:
    """Seconds until condition() held (AssertionError after `timeout`)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "not within the bound"
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.parametrize("lb", ["round_robin", "pick_first"])
def test_a_backend_not_serving_gets_no_call_and_none_fails(client, healthy_backends, lb):
    sick = healthy_backends[0]  # pick_first's first address: every call goes there while it is healthy
    channel = client.channel(target(healthy_backends), options(lb))
    load = Load(channel)
    wait_until(lambda: arrived_after(sick, 0) >= 5, timeout=10)
    flipped = time.monotonic()
    sick.health.set("echo", NOT_SERVING)
    time.sleep(1.5)
    quiet_from = flipped + 1.0
    assert arrived_after(sick, quiet_from) == 0, "a backend not serving still got calls a second later"
    assert sum(arrived_after(b, quiet_from) for b in healthy_backends[1:]) > 0
    sick.health.set("echo", SERVING)
    served = time.monotonic()
    back = wait_until(lambda: arrived_after(sick, served) > 0, timeout=2.0)
    codes = load.stop()
    assert set(codes) == {grpc.StatusCode.OK}, [c for c in codes if c != grpc.StatusCode.OK][:3]
    assert back < 2.0
    channel.close()
    # The sync flavor's watches are threads: none outlives its channel.
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "grpc_retry-health"], timeout=5)


def test_every_backend_not_serving_fails_fast_as_unavailable(client, healthy_backends):
    for backend in healthy_backends:
        backend.health.set("echo", NOT_SERVING)
    channel = client.channel(target(healthy_backends), options("round_robin"))
    outcome = channel.unary(UNARY, b"x", timeout=5)
    for _ in range(20):  # the first call may go out before the first health answers came
        if outcome.code == grpc.StatusCode.UNAVAILABLE:
            break
        time.sleep(0.05)
        outcome = channel.unary(UNARY, b"x", timeout=5)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE
    for backend in healthy_backends:
        backend.health.set("echo", SERVING)
    wait_until(lambda: channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK, timeout=2.0)
    channel.close()


def test_a_server_without_the_health_service_is_healthy_and_logged_once(client, caplog):
    backends = [Backend() for _ in range(2)]  # no health service: Watch answers UNIMPLEMENTED
    caplog.set_level(logging.WARNING, logger="grpc_retry")
    try:
        channel = client.channel(target(backends), options("round_robin"))
        for _ in range(20):
            assert channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK
        wait_until(lambda: any("UNIMPLEMENTED" in r.getMessage() for r in caplog.records), timeout=5)
        assert sum("UNIMPLEMENTED" in r.getMessage() for r in caplog.records) == 1

        def both_served() -> bool:
            assert channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK
            return all(len(b.attempts_of(UNARY)) > 0 for b in backends)
        # (round_robin serves the backends that are ready: the second may still be connecting at first)
        wait_until(both_served, timeout=5)
        assert sum("UNIMPLEMENTED" in r.getMessage() for r in caplog.records) == 1
        channel.close()
    finally:
        for backend in backends:
            backend.stop()


def test_inhibit_health_checking_turns_it_off(client, healthy_backends):
    sick = healthy_backends[0]
    sick.health.set("echo", NOT_SERVING)
    channel = client.channel(target(healthy_backends),
                             options("pick_first", "echo", ("grpc.inhibit_health_checking", 1)))
    for _ in range(5):
        assert channel.unary(UNARY, b"x", timeout=5).code == grpc.StatusCode.OK
    assert len(sick.attempts_of(UNARY)) == 5  # pick_first, health ignored: all on the first address
    channel.close()


def test_a_sync_channel_dropped_without_close_leaves_no_health_thread_or_sweep(healthy_backends):
    import gc
    import weakref

    import grpc_retry

    config = json.loads(options("round_robin")[0][1])
    config["loadBalancingConfig"] = [{"outlier_detection_experimental": {
        "interval": "0.05s", "failurePercentageEjection": {}, "childPolicy": [{"round_robin": {}}]}}]
    channel = grpc_retry.insecure_channel(target(healthy_backends),
                                          options=[("grpc.service_config", json.dumps(config))])
    for _ in range(6):
        channel.unary_unary(UNARY)(b"x", timeout=5)
    wait_until(lambda: [t for t in threading.enumerate() if t.name == "grpc_retry-health"], timeout=5)
    detector = weakref.ref(channel._subchannels.outliers)
    del channel

    def collected() -> bool:
        # Collected again while waiting: a collection can come as the channel's own sweep or health thread holds
        # it for a moment, which keeps its cycle for the next one (as any object in a cycle would be).
        gc.collect()
        return not [t for t in threading.enumerate() if t.name == "grpc_retry-health"]

    wait_until(collected, timeout=5)
    assert detector() is None
