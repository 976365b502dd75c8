"""Behind one address, and around a sick backend: grpcio's channel beside grpc_retry's (sync and asyncio), the
same service config (round_robin, retry policy maxAttempts 3 on UNAVAILABLE), real grpcio servers on loopback.
Attempts per call are counted at the servers.

Behind one address — three backends behind an L4 balancer on loopback (tests/support/l4.py), the third fails
every call UNAVAILABLE:
- fresh_rotate: 60 fresh channels, one call each, the balancer rotating connections; grpc_retry with
  `grpc_retry.connections_per_address` 3 (and 1, for the row "grpc_retry, 1 connection").
- long_random: 6 long-lived channels, calls for 6 s, the balancer picking a backend at random per connection;
  grpc_retry with 4 connections per address and outlier detection (and without, for the row "grpc_retry, no
  outlier detection"); figures after the first 2 s.
grpcio's channels each have a connection of their own here (`grpc.use_local_subchannel_pool`), as clients in
separate processes do.

Sick backend — three addresses, the third fails every call:
- outliers: calls for 6 s on one channel, figures after the first 2 s; without and with outlier detection
  (`outlier_detection_experimental`, which grpcio's channel also takes: same config on both).
- health: healthCheckConfig, the first backend flipped to NOT_SERVING while calls run, then back to SERVING:
  calls it got from 1 s after the flip, calls failed, seconds until it got a call again after SERVING.

Prints one JSON object as its last line. Usage: python bench/sick_backend.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import grpc
import grpc.aio

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))

from support.backend import UNARY, Backend, Step, fail  # noqa: E402
from support.l4 import L4Balancer  # noqa: E402

import grpc_retry  # noqa: E402
import grpc_retry.aio  # noqa: E402

SERVICE = "grpc_retry.test.Echo"
RETRY = {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
         "retryableStatusCodes": ["UNAVAILABLE"]}
OUTLIERS = {"interval": "0.5s", "baseEjectionTime": "5s", "maxEjectionPercent": 75,
            "failurePercentageEjection": {"threshold": 50, "minimumHosts": 2, "requestVolume": 5}}


def config(outliers: bool = False, health: bool = False) -> str:
    lb: Dict[str, Any] = {"round_robin": {}}
    if outliers:
        lb = {"outlier_detection_experimental": {**OUTLIERS, "childPolicy": [lb]}}
    doc: Dict[str, Any] = {"loadBalancingConfig": [lb],
                           "methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": RETRY}]}
    if health:
        doc["healthCheckConfig"] = {"serviceName": "echo"}
    return json.dumps(doc)


class Caller:
    """Opens channels of one kind and makes blocking unary calls on them."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        if kind.endswith(".aio"):
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True).start()

    def _run(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def open(self, target: str, options: List[Any]) -> Any:
        if self.kind == "grpc":
            return grpc.insecure_channel(target, options=options)
        if self.kind == "grpc_retry":
            return grpc_retry.insecure_channel(target, options=options)

        async def make() -> Any:
            module = grpc.aio if self.kind == "grpc.aio" else grpc_retry.aio
            return module.insecure_channel(target, options=options)

        return self._run(make())

    def call(self, channel: Any) -> grpc.StatusCode:
        method = channel.unary_unary(UNARY)
        if self._loop is None:
            try:
                method(b"x", timeout=10)
                return grpc.StatusCode.OK
            except grpc.RpcError as error:
                return error.code()

        async def call() -> grpc.StatusCode:
            try:
                await method(b"x", timeout=10)
                return grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                return error.code()

        return self._run(call())

    def close(self, channel: Any) -> None:
        if self._loop is None:
            channel.close()
        else:
            self._run(channel.close())


def attempts(backends: List[Backend]) -> int:
    return sum(len(b.attempts_of(UNARY)) for b in backends)


def rates(codes: List[grpc.StatusCode], tried: int) -> Dict[str, float]:
    return {"calls": len(codes), "success": round(codes.count(grpc.StatusCode.OK) / max(len(codes), 1), 4),
            "attempts_per_call": round(tried / max(len(codes), 1), 3)}


def three_backends(failing: Callable[[Backend], None] = lambda b: b.fallback(UNARY, lambda i: fail()),
                   health: bool = False) -> List[Backend]:
    backends = [Backend(health=health) for _ in range(3)]
    failing(backends[2])
    return backends


def l4_options(kind: str, connections: int, outliers: bool = False) -> List[Any]:
    """grpcio's channels each get a connection of their own, as clients in separate processes have (in one
    process they would share one subchannel: all on the bad backend or none)."""
    options: List[Any] = [("grpc.service_config", config(outliers))]
    if kind.startswith("grpc_retry"):
        options.append(("grpc_retry.connections_per_address", connections))
    else:
        options.append(("grpc.use_local_subchannel_pool", 1))
    return options


def fresh_rotate(kind: str, connections: int) -> Dict[str, float]:
    backends = three_backends()
    balancer = L4Balancer([b.target for b in backends], "rotate")
    caller = Caller(kind)
    options = l4_options(kind, connections)
    codes = []
    for _ in range(60):
        channel = caller.open(balancer.target, options)
        codes.append(caller.call(channel))
        caller.close(channel)
    figures = rates(codes, attempts(backends))
    balancer.close()
    for backend in backends:
        backend.stop()
    return figures


def timed(caller: Caller, channels: List[Any], backends: List[Backend], seconds: float,
          settle: float) -> Dict[str, float]:
    """Calls round the channels for `seconds`; the figures of those after `settle`."""
    start = time.monotonic()
    codes: List[grpc.StatusCode] = []
    before: Optional[int] = None
    i = 0
    while time.monotonic() - start < seconds:
        if before is None and time.monotonic() - start >= settle:
            before = attempts(backends)
        code = caller.call(channels[i % len(channels)])
        i += 1
        if before is not None:
            codes.append(code)
    return rates(codes, attempts(backends) - (before or 0))


def long_random(kind: str, seconds: float, outliers: bool = True) -> Dict[str, float]:
    backends = three_backends()
    balancer = L4Balancer([b.target for b in backends], "random", seed=7)
    caller = Caller(kind)
    options = l4_options(kind, 4, outliers)
    channels = [caller.open(balancer.target, options) for _ in range(6)]
    figures = timed(caller, channels, backends, seconds, 2.0)
    for channel in channels:
        caller.close(channel)
    balancer.close()
    for backend in backends:
        backend.stop()
    return figures


def outliers(kind: str, seconds: float, detect: bool) -> Dict[str, float]:
    backends = three_backends()
    caller = Caller(kind)
    target = "ipv4:" + ",".join(b.target for b in backends)
    channel = caller.open(target, [("grpc.service_config", config(outliers=detect))])
    figures = timed(caller, [channel], backends, seconds, 2.0)
    caller.close(channel)
    for backend in backends:
        backend.stop()
    return figures


def health_flip(kind: str) -> Dict[str, Any]:
    from grpc_health.v1 import health_pb2

    backends = three_backends(lambda b: b.fallback(UNARY, lambda i: Step()), health=True)
    for backend in backends:
        backend.health.set("echo", health_pb2.HealthCheckResponse.SERVING)
    caller = Caller(kind)
    channel = caller.open("ipv4:" + ",".join(b.target for b in backends),
                          [("grpc.service_config", config(health=True))])
    codes: List[grpc.StatusCode] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            codes.append(caller.call(channel))

    thread = threading.Thread(target=load)
    thread.start()
    time.sleep(1.0)
    sick = backends[0]
    flipped = time.monotonic()
    sick.health.set("echo", health_pb2.HealthCheckResponse.NOT_SERVING)
    time.sleep(2.0)
    after = sum(1 for a in sick.attempts_of(UNARY) if a.arrived > flipped + 1.0)
    served = time.monotonic()
    sick.health.set("echo", health_pb2.HealthCheckResponse.SERVING)
    back: Optional[float] = None
    while time.monotonic() - served < 5 and back is None:
        if any(a.arrived > served for a in sick.attempts_of(UNARY)):
            back = round(time.monotonic() - served, 2)
        time.sleep(0.01)
    stop.set()
    thread.join()
    caller.close(channel)
    for backend in backends:
        backend.stop()
    return {"calls_to_it_from_1s_after_not_serving": after,
            "failed_calls": sum(1 for c in codes if c != grpc.StatusCode.OK), "calls": len(codes),
            "back_after_serving_s": back}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    kinds = ["grpc", "grpc_retry", "grpc_retry.aio"]
    report: Dict[str, Any] = {"behind_one_address": {}, "sick_backend": {}}
    one = report["behind_one_address"]
    one["fresh_rotate"] = {kind: fresh_rotate(kind, 3) for kind in kinds}
    one["fresh_rotate"]["grpc_retry, 1 connection"] = fresh_rotate("grpc_retry", 1)
    one["long_random"] = {kind: long_random(kind, args.seconds) for kind in kinds}
    one["long_random"]["grpc_retry, no outlier detection"] = long_random("grpc_retry", args.seconds, False)
    sick = report["sick_backend"]
    sick["no_outlier_detection"] = {kind: outliers(kind, args.seconds, False) for kind in kinds}
    sick["outlier_detection"] = {kind: outliers(kind, args.seconds, True) for kind in kinds}
    sick["health_flip"] = {kind: health_flip(kind) for kind in kinds}
    for section in report.values():
        for name, row in section.items():
            print(name, json.dumps(row), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
