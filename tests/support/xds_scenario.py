"""xDS scenarios shared by the tests of `xds:` channels: clusters of real backends served by a real control plane
(support/control_plane.py), and grpcio's own xDS client in a process of its own on the same plane, the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import grpc
from envoy.config.route.v3 import route_components_pb2
from google.protobuf import wrappers_pb2

from support.backend import UNARY, Backend
from support.control_plane import ControlPlane
from support.xds_resources import cluster, endpoints, lb_endpoint, route_config


def serve(plane: ControlPlane, clusters: Dict[str, List[Backend]],
          routes: Callable[[Any], Any] = lambda config: None) -> int:
    """Clusters of backends; the route config sends every call to the first cluster unless `routes` changes it.
    The route config's version."""
    for name, backends in clusters.items():
        plane.set(cluster(lambda c, n=name: setattr(c, "name", n)))
        plane.set(endpoints(lambda e, n=name, b=backends: assign(e, n, b)))
    first = next(iter(clusters))

    def edit(config: Any) -> None:
        config.virtual_hosts[0].routes[0].route.cluster = first
        routes(config)
    return plane.set(route_config(edit))


def assign(message: Any, name: str, backends: List[Backend]) -> None:
    message.cluster_name = name
    del message.endpoints[0].lb_endpoints[:]
    message.endpoints[0].lb_endpoints.extend(lb_endpoint("127.0.0.1", b.port) for b in backends)


def route_retries(num_retries: int, on: str = "unavailable") -> route_components_pb2.RetryPolicy:
    return route_components_pb2.RetryPolicy(retry_on=on, num_retries=wrappers_pb2.UInt32Value(value=num_retries))


def calls_on(backends: List[Backend]) -> List[int]:
    return [len(b.attempts_of(UNARY)) for b in backends]


_GRPCIO_CALLS = """
import json, sys
import grpc
calls = json.loads(sys.argv[1])
with grpc.insecure_channel("xds:///svc") as channel:
    method = channel.unary_unary("{method}")
    codes = []
    for metadata in calls:
        try:
            method(b"x", timeout=10, metadata=[tuple(pair) for pair in metadata])
            codes.append(["OK", ""])
        except grpc.RpcError as error:
            codes.append([error.code().name, error.details()])
print(json.dumps(codes))
""".replace("{method}", UNARY)


def grpcio_env(plane: ControlPlane, features: Tuple[str, ...] = ()) -> Dict[str, str]:
    """The environment of a grpcio process on `plane`, as node "grpcio" (this process's xDS settings left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_XDS")}
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = plane.bootstrap("grpcio", features)
    return env


def grpcio_calls(plane: ControlPlane, calls: List[Any]) -> List[List[str]]:
    """Calls through grpcio's own xDS client, in a process of its own on the same control plane: each one's code
    and details."""
    env = grpcio_env(plane)
    done = subprocess.run([sys.executable, "-c", _GRPCIO_CALLS, json.dumps(calls)], capture_output=True, text=True,
                          env=env, timeout=60, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


_GRPCIO_CLIENT = """
import json, sys
import grpc
with grpc.insecure_channel("xds:///svc") as channel:
    method = channel.unary_unary("{method}")
    for line in sys.stdin:
        try:
            method(b"x", timeout=10)
            outcome = ["OK", ""]
        except grpc.RpcError as error:
            outcome = [error.code().name, error.details()]
        print(json.dumps(outcome + [channel._channel.check_connectivity_state(False)]), flush=True)
""".replace("{method}", UNARY)


class GrpcioClient:
    """grpcio's own xDS client in a process of its own on the same control plane, one channel for its life: each
    call()'s code, details (its node ID as ours: `node`) and the channel's state after it."""

    def __init__(self, plane: ControlPlane, node: str, features: Tuple[str, ...] = ()) -> None:
        env = grpcio_env(plane, features)
        self._node = node
        self._process = subprocess.Popen([sys.executable, "-c", _GRPCIO_CLIENT], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())

    def call(self) -> List[Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write("call\n")
        self._process.stdin.flush()
        code, details, state = json.loads(self._process.stdout.readline())
        return [code, details.replace("(node ID:grpcio)", f"(node ID:{self._node})"),
                next(s for s in grpc.ChannelConnectivity if s.value[0] == state)]

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(30)


def until(call: Callable[[], List[Any]], done: Callable[[List[Any]], bool]) -> List[Any]:
    """Call until the outcome is `done` (the change an update makes reaches a channel after the control plane
    has sent it: no event of the channel's tells when): the outcome."""
    deadline = time.monotonic() + 10
    outcome = call()
    while not done(outcome) and time.monotonic() < deadline:
        time.sleep(0.05)
        outcome = call()
    return outcome
