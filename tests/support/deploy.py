"""Deployments as a production team lives them, run against real clients side by side: backend pods (processes on
127.0.0.x, one port), a real DNS server whose answers change, and client processes (tests/support/deploy_client.py)
calling all the while. Each scenario returns, per client, its calls, failures and the scenario's figure.

A pod's grpcio server, stopped, cancels (CANCELLED) a call it had accepted but not yet handed to its handler when
the stop began: a client of any kind sees that now and then where calls are still sent to a pod as it stops
(restart). Pods leave DNS before they stop, as a deployment with a preStop wait does.

Scenarios (times from the first action):
- restart: a pod of a static 3-address target stops gracefully, and is back on its address `gap` s later; figure:
  seconds from its restart to its first answer.
- replace: a new pod at a new address comes into DNS and one old pod stops; figure: seconds from the DNS change to
  the new pod's first answer.
- scale_up / scale_up_age: 2 pods become 4 in DNS, with no connection lost / with the pods' max_connection_age;
  figure: seconds until both new pods have answered.
- rolling: each of 3 pods is replaced with surge (the new pod in DNS `surge` s before the old one leaves DNS, and
  the old one stopped gracefully `surge` s after that, as a preStop hook's wait does), `gap` s apart, `rounds`
  times over; figure: failed calls.
- all_replaced: every pod at once (new ones in DNS, then the old ones stop); figure: failed calls.

Used by tests/integration/test_deployments.py, bench/deploy.py and `bench/soak.py --deploy`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from support.dns_server import DnsServer  # noqa: E402
from support.pod import UNARY, Pod  # noqa: E402

NAME = "svc.test"
SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{"name": [{"service": "grpc_retry.test.Echo"}],
                      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
                                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})
__all__ = ["UNARY", "Pod", "DnsServer", "Settings", "Result", "Fleet", "run", "free_port"]
SCENARIOS = ("restart", "replace", "scale_up", "scale_up_age", "rolling", "all_replaced")


@dataclass
class Settings:
    """What the clients are given, and how long the scenario runs after its first action."""

    min_interval_ms: Optional[int] = None   # grpc.dns_min_time_between_resolutions_ms, both clients (None: 30 s)
    refresh_ms: Optional[int] = None        # grpc_retry.dns_refresh_ms, grpc_retry clients (None: 30 s)
    reconnect_max_ms: Optional[int] = None  # grpc.max_reconnect_backoff_ms, both clients
    after: float = 8.0                      # seconds the clients run after the first action
    gap: float = 3.0                        # restart: seconds down; rolling: between two pods
    surge: float = 2.0                      # rolling: seconds a new pod is in DNS before its old one leaves
    rounds: int = 1                         # rolling: how many times the whole fleet is replaced
    max_age: float = 3.0                    # scale_up_age: the pods' max_connection_age, seconds

    def options(self, kind: str) -> List[Any]:
        options: List[Any] = [("grpc.service_config", SERVICE_CONFIG)]
        if self.min_interval_ms is not None:
            options.append(("grpc.dns_min_time_between_resolutions_ms", self.min_interval_ms))
        if self.reconnect_max_ms is not None:
            options += [("grpc.initial_reconnect_backoff_ms", min(100, self.reconnect_max_ms)),
                        ("grpc.min_reconnect_backoff_ms", min(100, self.reconnect_max_ms)),
                        ("grpc.max_reconnect_backoff_ms", self.reconnect_max_ms)]
        if kind.startswith("grpc_retry") and self.refresh_ms is not None:
            options.append(("grpc_retry.dns_refresh_ms", self.refresh_ms))
        return options


@dataclass
class Result:
    kind: str
    calls: List[List[Any]]
    events: Dict[str, float]
    figure: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(1 for call in self.calls if call[2] != "OK")

    def first_answer(self, responder: str, after: float) -> Optional[float]:
        """Seconds after `after` until `responder` first answered a call started then or later (None: never)."""
        ends = [call[1] for call in self.calls if call[3] == responder and call[0] >= after]
        return round(min(ends) - after, 2) if ends else None

    def as_dict(self) -> Dict[str, Any]:
        failures: Dict[str, int] = {}
        for call in self.calls:
            if call[2] != "OK":
                key = f"{call[2]} {call[3][1:]}"  # code and details
                failures[key] = failures.get(key, 0) + 1
        return {"kind": self.kind, "calls": len(self.calls), "failed": self.failed, "figure": self.figure,
                **({"failures": failures} if failures else {}), **self.extra}


def free_port(hosts: Sequence[str]) -> int:
    """A port free on every one of `hosts`."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts:
                with socket.socket() as sock:
                    sock.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


class Fleet:
    """Pods on 127.0.0.2, .3, … (one port), and the DNS name that lists some of them."""

    def __init__(self, dns: Optional[DnsServer], max_age: Optional[float] = None) -> None:
        self.dns = dns
        self.max_age = max_age
        self.port = free_port([f"127.0.0.{i}" for i in range(2, 60)])
        self.pods: Dict[str, Pod] = {}
        self._lock = threading.Lock()

    @staticmethod
    def host(i: int) -> str:
        return f"127.0.0.{i + 2}"

    def start(self, i: int) -> str:
        pod = Pod(self.host(i), self.port, max_age=self.max_age)
        with self._lock:
            self.pods[pod.host] = pod
        return pod.address

    def stop(self, i: int) -> None:
        with self._lock:
            pod = self.pods.pop(self.host(i))
        pod.stop()

    def publish(self, *indices: int) -> None:
        assert self.dns is not None
        self.dns.set(NAME, [self.host(i) for i in indices])

    def address(self, i: int) -> str:
        return f"{self.host(i)}:{self.port}"

    def target(self) -> str:
        assert self.dns is not None
        return self.dns.target(NAME, self.port)

    def close(self) -> None:
        for pod in list(self.pods.values()):
            pod.kill()
        if self.dns is not None:
            self.dns.close()


def _start_client(kind: str, target: str, options: List[Any], seconds: float) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, os.path.join(HERE, "deploy_client.py"), kind, target,
                                json.dumps(options), str(seconds)], stdout=subprocess.PIPE, text=True)
    return process


def run(scenario: str, kinds: Sequence[str], settings: Settings) -> List[Result]:
    """Run `scenario` with one client process per kind, side by side; their results."""
    dns = None if scenario == "restart" else DnsServer()
    fleet = Fleet(dns, max_age=settings.max_age if scenario == "scale_up_age" else None)
    events: Dict[str, float] = {}
    clients: List[subprocess.Popen[str]] = []
    try:
        initial = [0, 1] if scenario.startswith("scale_up") else [0, 1, 2]
        for i in initial:
            fleet.start(i)
        if dns is not None:
            fleet.publish(*initial)
            target = fleet.target()
        else:
            target = "ipv4:" + ",".join(fleet.address(i) for i in initial)
        lead = 2.0  # seconds of calls before the first action
        seconds = lead + settings.after
        clients = [_start_client(kind, target, settings.options(kind), seconds) for kind in kinds]
        for client in clients:
            assert client.stdout is not None
            line = client.stdout.readline().strip()
            assert line == "ready", f"client did not start: {line!r}"
        time.sleep(lead)
        _ACTIONS[scenario](fleet, settings, events)
        results = []
        for kind, client in zip(kinds, clients, strict=True):
            out, _ = client.communicate(timeout=seconds + 60)
            data = json.loads(out.strip().splitlines()[-1])
            results.append(Result(kind, data["calls"], dict(events)))
        for result in results:
            _FIGURES[scenario](fleet, result)
        return results
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
            client.wait()
        fleet.close()


def _restart(fleet: Fleet, settings: Settings, events: Dict[str, float]) -> None:
    events["stop"] = time.monotonic()
    fleet.stop(0)
    time.sleep(max(0.0, events["stop"] + settings.gap - time.monotonic()))
    fleet.start(0)
    events["back"] = time.monotonic()


def _replace(fleet: Fleet, settings: Settings, events: Dict[str, float]) -> None:
    fleet.start(3)
    fleet.publish(1, 2, 3)
    events["published"] = time.monotonic()
    fleet.stop(0)


def _scale_up(fleet: Fleet, settings: Settings, events: Dict[str, float]) -> None:
    fleet.start(2)
    fleet.start(3)
    fleet.publish(0, 1, 2, 3)
    events["published"] = time.monotonic()


def _rolling(fleet: Fleet, settings: Settings, events: Dict[str, float]) -> None:
    live = [0, 1, 2]
    for old in range(3 * settings.rounds):
        new = old + 3
        fleet.start(new)
        live.append(new)
        fleet.publish(*live)
        time.sleep(settings.surge)
        live.remove(old)
        fleet.publish(*live)
        time.sleep(settings.surge)  # a preStop hook's wait: the old pod leaves DNS before it stops
        fleet.stop(old)
        time.sleep(settings.gap)
    events["done"] = time.monotonic()


def _all_replaced(fleet: Fleet, settings: Settings, events: Dict[str, float]) -> None:
    for new in (3, 4, 5):
        fleet.start(new)
    fleet.publish(3, 4, 5)
    events["published"] = time.monotonic()
    time.sleep(settings.surge)
    for old in (0, 1, 2):
        fleet.stop(old)
    events["done"] = time.monotonic()


_ACTIONS: Dict[str, Callable[[Fleet, Settings, Dict[str, float]], None]] = {
    "restart": _restart, "replace": _replace, "scale_up": _scale_up, "scale_up_age": _scale_up,
    "rolling": _rolling, "all_replaced": _all_replaced}


def _figure_restart(fleet: Fleet, result: Result) -> None:
    result.figure = result.first_answer(fleet.address(0), result.events["back"])


def _figure_replace(fleet: Fleet, result: Result) -> None:
    result.figure = result.first_answer(fleet.address(3), result.events["published"])


def _figure_scale_up(fleet: Fleet, result: Result) -> None:
    firsts = [result.first_answer(fleet.address(i), result.events["published"]) for i in (2, 3)]
    result.figure = None if None in firsts else max(f for f in firsts if f is not None)


def _figure_failed(fleet: Fleet, result: Result) -> None:
    result.figure = float(result.failed)
    # Which pods answered the last second of calls: after an all-new fleet, only new ones.
    end = max((call[0] for call in result.calls), default=0.0)
    result.extra["last_responders"] = sorted({call[3] for call in result.calls
                                              if call[0] >= end - 1 and call[2] == "OK"})


_FIGURES: Dict[str, Callable[[Fleet, Result], None]] = {
    "restart": _figure_restart, "replace": _figure_replace, "scale_up": _figure_scale_up,
    "scale_up_age": _figure_scale_up, "rolling": _figure_failed, "all_replaced": _figure_failed}
