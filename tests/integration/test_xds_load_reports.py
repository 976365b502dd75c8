"""Load reports (LRS) told by a real control plane, with grpcio's own xDS client on the same control plane as the
oracle: a cluster whose lrs_server is the management server reports, per locality, the calls issued, succeeded and
failed, adding up to the calls made, as grpcio's do; drops by category; none for a cluster without lrs_server."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.core.v3 import config_source_pb2  # noqa: E402
from envoy.type.v3 import percent_pb2  # noqa: E402
from support.backend import UNARY, Backend, fail  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints  # noqa: E402
from support.xds_scenario import GrpcioClient, assign, serve  # noqa: E402

import grpc_retry  # noqa: E402


def reporting(message: Any) -> None:
    message.lrs_server.CopyFrom(config_source_pb2.ConfigSource(self=config_source_pb2.SelfConfigSource()))


def totals_reach(plane: ControlPlane, node: str, want: Dict[str, int]) -> Dict[str, int]:
    """`node`'s totals for c1 once they reach `want` (reports come at the plane's interval: polled), or as they
    stand after 10 s."""
    deadline = time.monotonic() + 10
    totals = plane.load_totals(node, "c1")
    while any(totals[k] < v for k, v in want.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
        totals = plane.load_totals(node, "c1")
    return totals


def test_reports_add_up_to_the_calls_made_as_grpcios(client: Any, plane: ControlPlane,
                                                     backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:2]})
    plane.set(cluster(reporting))
    backends[1].fallback(UNARY, lambda i: fail(code=grpc.StatusCode.INTERNAL))
    channel = client.channel("xds:///svc")
    codes = [channel.unary(UNARY, b"x", timeout=10).code for _ in range(50)]
    failed = codes.count(grpc.StatusCode.INTERNAL)
    ours = totals_reach(plane, "channels", {"issued": 50, "succeeded": 50 - failed, "failed": failed})
    assert ours == {"issued": 50, "succeeded": 50 - failed, "failed": failed, "in_progress": 0, "dropped": 0}
    grpcio = GrpcioClient(plane, "grpcio")  # (one process for the calls and its reports after them)
    try:
        theirs_codes = [grpcio.call()[0] for _ in range(50)]
        theirs = totals_reach(plane, "grpcio", {"issued": 50})
    finally:
        grpcio.close()
    assert theirs["issued"] == 50 and theirs["failed"] == theirs_codes.count("INTERNAL")
    assert 0 < failed < 50
    (held,) = [r for r in grpc_retry.xds_status() if r.type == "Cluster" and r.name == "c1"
               and r.server == plane.target]
    assert held.load_reports.startswith("reporting to the management server")


def test_drops_are_reported_by_category(client: Any, plane: ControlPlane, backends: List[Backend]) -> None:
    def dropping(message: Any) -> None:
        assign(message, "c1", backends[:1])
        message.policy.drop_overloads.add(category="throttle", drop_percentage=percent_pb2.FractionalPercent(
            numerator=100, denominator=percent_pb2.FractionalPercent.HUNDRED))
    serve(plane, {"c1": backends[:1]})
    plane.set(cluster(reporting))
    plane.set(endpoints(dropping))
    channel = client.channel("xds:///svc")
    deadline = time.monotonic() + 10
    while channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK and time.monotonic() < deadline:
        pass  # (until the drops have come)
    for _ in range(9):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.UNAVAILABLE
    assert totals_reach(plane, "channels", {"dropped": 10})["dropped"] >= 10
    with plane._lock:
        categories = {d.category for _, stats in plane.load_reports for d in stats.dropped_requests}
    assert categories == {"throttle"}


def test_a_cluster_without_lrs_server_sends_no_report(client: Any, plane: ControlPlane,
                                                      backends: List[Backend]) -> None:
    serve(plane, {"c1": backends[:1]})
    channel = client.channel("xds:///svc")
    for _ in range(5):
        assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    time.sleep(3 * plane.report_interval)  # (a report would have come by now: nothing tells that none will)
    assert plane.load_totals("channels", "c1")["issued"] == 0


