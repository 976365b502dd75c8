"""grpc_retry's xDS client at mesh scale, against a real ADS server (tests/support/control_plane.py) on loopback:

- eds_apply_ms: a ClusterLoadAssignment of N endpoints (1,000 by default) changed on the server until the target's
  whole new config reaches its watcher (stream, decode, checks, cache, follow), median and p90;
- channel_apply_ms: the same change, until a grpc_retry channel on `xds:///svc` has the new endpoints in its
  cluster's subchannels (its next pick uses them), median and p90;
- channel_bytes_per_endpoint: what the channel holds per endpoint once it has them (the decoded assignment and its
  subchannel slots; no connection is made: the channel is not used);
- eds_decode_ms: the decode and checks alone, of the same resource;
- bytes_per_endpoint: what one endpoint of a decoded assignment holds (tracemalloc);
- channels / streams / eds_subscriptions: CHANNELS grpc_retry channels to one `xds:` name in one process: the ADS
  streams the server saw and the ClusterLoadAssignment subscriptions it was sent (names);
- pick_1000_vs_3: the call machine's pick over N READY backends against over 3 (its ratio; one process,
  alternating rounds).

Prints one JSON object. Needs the `xds` extra. python bench/mesh.py [--endpoints N] [--rounds R] [--channels C]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import tracemalloc
from typing import Any, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from envoy.config.core.v3 import address_pb2, base_pb2  # noqa: E402
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.control_plane import ENDPOINTS, ControlPlane  # noqa: E402
from support.xds_resources import cluster, listener, route_config  # noqa: E402

import grpc_retry  # noqa: E402
from grpc_retry._backends.xds import endpoints as eds  # noqa: E402
from grpc_retry._backends.xds.bootstrap import parse  # noqa: E402
from grpc_retry._backends.xds.client import XdsClient  # noqa: E402
from grpc_retry._backends.xds.config import ConfigWatcher, XdsConfig  # noqa: E402
from grpc_retry._core import ROUND_ROBIN, Picker  # noqa: E402


def assignment(count: int, port: int) -> Any:
    """`count` endpoints in 10 localities, on loopback addresses (each its own)."""
    localities = []
    for z in range(10):
        lb = [endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(
            address=address_pb2.Address(socket_address=address_pb2.SocketAddress(
                address=f"127.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", port_value=port))))
            for i in range(z * count // 10 + 1, (z + 1) * count // 10 + 1)]
        localities.append(endpoint_components_pb2.LocalityLbEndpoints(
            locality=base_pb2.Locality(region="r", zone=f"z{z}"), lb_endpoints=lb,
            load_balancing_weight=wrappers_pb2.UInt32Value(value=1)))
    return endpoint_pb2.ClusterLoadAssignment(cluster_name="c1", endpoints=localities)


class Latest:
    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.config: Any = None

    def on_config(self, config: XdsConfig) -> None:
        with self.changed:
            self.config = config
            self.changed.notify_all()

    def wait_port(self, port: int, timeout: float = 10.0) -> None:
        def arrived() -> bool:
            assignment = self.config.endpoints.get("c1") if self.config is not None else None
            return assignment is not None and assignment.priorities[0][0].endpoints[0].addresses[0].endswith(
                f":{port}")
        with self.changed:
            if not self.changed.wait_for(arrived, timeout):
                raise RuntimeError("the new assignment did not arrive")


def apply_times(plane: ControlPlane, count: int, rounds: int) -> List[float]:
    bootstrap = parse(plane.bootstrap("bench"))
    client = XdsClient(bootstrap.xds_servers[0], bootstrap.node)
    latest = Latest()
    watcher = ConfigWatcher(client, "svc", "svc", latest.on_config, lambda _: None)
    messages = [assignment(count, 1000 + r) for r in range(rounds + 1)]
    try:
        plane.set(messages[0])
        latest.wait_port(1000)
        times = []
        for r in range(1, rounds + 1):
            started = time.perf_counter()
            plane.set(messages[r])
            latest.wait_port(1000 + r)
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        watcher.close()
        client.close()


def channel_apply_times(plane: ControlPlane, count: int, rounds: int) -> Tuple[List[float], float]:
    os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = plane.bootstrap("bench-channel")
    channel = grpc_retry.insecure_channel("xds:///svc")
    router = channel._router  # type: ignore[attr-defined]
    changed = threading.Condition()

    def tell() -> None:
        with changed:
            changed.notify_all()
    router.watch(tell)

    def wait_port(port: int) -> None:
        def arrived() -> bool:
            return any(f"ipv4:127.0.0.1:{port}" in s.live_addresses for s in router.subchannels())
        with changed:
            if not changed.wait_for(arrived, 10):
                raise RuntimeError("the channel did not get the new endpoints")
    messages = [assignment(count, 2000 + r) for r in range(rounds + 1)]
    try:
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        plane.set(messages[0])
        wait_port(2000)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        held = sum(s.size_diff for s in after.compare_to(before, "lineno")) / count
        times = []
        for r in range(1, rounds + 1):
            started = time.perf_counter()
            plane.set(messages[r])
            wait_port(2000 + r)
            times.append((time.perf_counter() - started) * 1000)
        return times, held
    finally:
        channel.close()


def decode_times(count: int, rounds: int) -> List[float]:
    data = assignment(count, 1).SerializeToString()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        eds.decode(data)
        times.append((time.perf_counter() - started) * 1000)
    return times


def bytes_per_endpoint(count: int) -> float:
    data = assignment(count, 1).SerializeToString()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = eds.decode(data)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(s.size_diff for s in after.compare_to(before, "lineno"))
    del kept
    return held / count


def sharing(plane: ControlPlane, channels: int) -> dict:
    """`channels` grpc_retry channels to one xds: name, each waiting for its whole config."""
    os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = plane.bootstrap("shared")
    before = len(plane.requests)
    made = [grpc_retry.insecure_channel("xds:///svc") for _ in range(channels)]
    for channel in made:
        if not channel._router.wait(20):  # type: ignore[attr-defined]
            raise RuntimeError("a channel got no config")
    streams = plane.streams()
    names = {name for r in plane.requests[before:] if r.type_url == ENDPOINTS for name in r.names}
    subscriptions = sum(1 for r in plane.requests[before:] if r.type_url == ENDPOINTS and not r.nonce)
    for channel in made:
        channel.close()
    return {"channels": channels, "streams": streams, "eds_subscriptions": subscriptions,
            "eds_names": sorted(names)}


def pick_ratio(count: int, rounds: int, picks: int = 20000) -> float:
    big, small = Picker(ROUND_ROBIN, count), Picker(ROUND_ROBIN, 3)
    for picker, size in ((big, count), (small, 3)):
        for i in range(size):
            picker.set_state(i, 2)  # READY
    ratios = []
    for _ in range(rounds):
        costs = []
        for picker in (big, small):
            started = time.perf_counter()
            for _ in range(picks):
                picker.pick(0)
            costs.append(time.perf_counter() - started)
        ratios.append(costs[0] / costs[1])
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--channels", type=int, default=100)
    args = parser.parse_args()
    plane = ControlPlane()
    try:
        for resource in (listener(), route_config(), cluster()):
            plane.set(resource)
        applied = apply_times(plane, args.endpoints, args.rounds)
        in_channel, channel_bytes = channel_apply_times(plane, args.endpoints, args.rounds)
        decoded = decode_times(args.endpoints, args.rounds)
        shared = sharing(plane, args.channels)
    finally:
        plane.close()
    print(json.dumps({
        "endpoints": args.endpoints,
        "eds_apply_ms": {"median": round(statistics.median(applied), 2),
                         "p90": round(sorted(applied)[int(0.9 * (len(applied) - 1))], 2)},
        "channel_apply_ms": {"median": round(statistics.median(in_channel), 2),
                             "p90": round(sorted(in_channel)[int(0.9 * (len(in_channel) - 1))], 2)},
        "channel_bytes_per_endpoint": round(channel_bytes),
        "eds_decode_ms": round(statistics.median(decoded), 2),
        "bytes_per_endpoint": round(bytes_per_endpoint(args.endpoints)),
        **shared,
        "pick_1000_vs_3": round(pick_ratio(args.endpoints, 9), 2),
    }))


if __name__ == "__main__":
    main()
