"""xDS fault injection (gRFC A33) told by a real control plane, with grpcio's own xDS client on the same control
plane as the oracle: an aborted share within its binomial bounds, with grpcio's status and words, reaching no
backend and not retried (as on grpcio, the fault sits above the retries); a delay that holds the first attempt
while the deadline runs; header-driven aborts; per-route overrides that replace or disable the listener's config;
max_active_faults."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, List

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2  # noqa: E402
from envoy.extensions.filters.http.fault.v3 import fault_pb2  # noqa: E402
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: E402
from envoy.type.v3 import percent_pb2  # noqa: E402
from google.protobuf import duration_pb2, wrappers_pb2  # noqa: E402
from support.backend import UNARY, Backend  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.xds_resources import http_filter, listener, packed  # noqa: E402
from support.xds_scenario import grpcio_calls, route_retries, serve, until  # noqa: E402

FAULTED = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"


def percent(n: int) -> percent_pb2.FractionalPercent:
    return percent_pb2.FractionalPercent(numerator=n, denominator=percent_pb2.FractionalPercent.HUNDRED)


def abort(code: int, share: int = 100) -> fault_pb2.HTTPFault:
    return fault_pb2.HTTPFault(abort=fault_pb2.FaultAbort(grpc_status=code, percentage=percent(share)))


def delay(seconds: float, share: int = 100, **fields: Any) -> fault_pb2.HTTPFault:
    return fault_pb2.HTTPFault(delay=common_fault_pb2.FaultDelay(
        fixed_delay=duration_pb2.Duration(nanos=int(seconds * 1e9)), percentage=percent(share)), **fields)


def with_fault(plane: ControlPlane, config: fault_pb2.HTTPFault) -> None:
    def edit(manager: Any) -> None:
        del manager.http_filters[:]
        manager.http_filters.extend([http_filter("fault", config), http_filter("router", router_pb2.Router())])
    plane.set(listener(edit))


def settled(channel: Any, expect: grpc.StatusCode) -> None:
    """The config has reached the channel: a call ends `expect` (no event of the channel's tells when)."""
    outcome = until(lambda: [channel.unary(UNARY, b"x", timeout=10).code], lambda codes: codes == [expect])
    assert outcome == [expect]


def attempts(backends: List[Backend]) -> int:
    return sum(len(b.attempts_of(UNARY)) for b in backends)


def test_an_abort_share_fails_as_on_grpcio_and_reaches_no_backend(client: Any, plane: ControlPlane,
                                                                 backends: List[Backend]) -> None:
    # The route retries UNAVAILABLE: an injected abort still is not retried.
    serve(plane, {"c1": backends},
          lambda config: config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(route_retries(3)))
    with_fault(plane, abort(14))
    channel = client.channel("xds:///svc")
    settled(channel, grpc.StatusCode.UNAVAILABLE)
    outcome = channel.unary(UNARY, b"x", timeout=10)
    assert (outcome.code, outcome.details) == (grpc.StatusCode.UNAVAILABLE, "Fault injected")
    assert grpcio_calls(plane, [[]]) == [["UNAVAILABLE", "Fault injected"]]
    assert attempts(backends) == 0
    with_fault(plane, abort(10, share=50))
    settled(channel, grpc.StatusCode.OK)  # (the first OK: the new config came)
    before = attempts(backends)
    codes = [channel.unary(UNARY, b"x", timeout=10).code for _ in range(200)]
    aborted = codes.count(grpc.StatusCode.ABORTED)
    theirs = [code for code, _ in grpcio_calls(plane, [[]] * 200)]
    # 200 draws at 50%: a share outside 60-140 has odds under 1e-8
    assert 60 <= aborted <= 140 and 60 <= theirs.count("ABORTED") <= 140, (aborted, theirs.count("ABORTED"))
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.ABORTED} and set(theirs) == {"OK", "ABORTED"}
    ok = 200 - aborted + theirs.count("OK")
    assert attempts(backends) - before == ok  # only the calls that went on reached a backend, each once


def test_a_delay_holds_the_first_attempt_while_the_deadline_runs(client: Any, plane: ControlPlane,
                                                                 backends: List[Backend]) -> None:
    serve(plane, {"c1": backends})
    with_fault(plane, delay(0.3))
    channel = client.channel("xds:///svc")
    until(lambda: [channel.unary(UNARY, b"x", timeout=0.1).code],
          lambda codes: codes == [grpc.StatusCode.DEADLINE_EXCEEDED])
    before = attempts(backends)
    started = time.monotonic()
    assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
    assert time.monotonic() - started >= 0.3
    assert channel.unary(UNARY, b"x", timeout=0.1).code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert attempts(backends) - before == 1  # the call that outlived its delay; the other sent nothing
    assert [code for code, _ in grpcio_calls(plane, [[]])] == ["OK"]


def test_a_header_asks_for_the_abort_and_can_lower_its_share(client: Any, plane: ControlPlane,
                                                            backends: List[Backend]) -> None:
    serve(plane, {"c1": backends})
    config = fault_pb2.HTTPFault(abort=fault_pb2.FaultAbort(header_abort=fault_pb2.FaultAbort.HeaderAbort(),
                                                            percentage=percent(100)))
    with_fault(plane, config)
    channel = client.channel("xds:///svc")
    asked = [("x-envoy-fault-abort-grpc-request", "7")]
    until(lambda: [channel.unary(UNARY, b"x", timeout=10, metadata=asked).code],
          lambda codes: codes == [grpc.StatusCode.PERMISSION_DENIED])
    calls = [asked, [], [("x-envoy-fault-abort-grpc-request", "x")],
             [("x-envoy-fault-abort-grpc-request", "14"), ("x-envoy-fault-abort-percentage", "0")]]
    ours = [channel.unary(UNARY, b"x", timeout=10, metadata=m) for m in calls]
    assert [(o.code.name, o.details if o.code != grpc.StatusCode.OK else "") for o in ours] == \
        [tuple(r) if r[0] != "OK" else ("OK", "") for r in grpcio_calls(plane, calls)] == \
        [("PERMISSION_DENIED", "Fault injected"), ("OK", ""), ("UNKNOWN", "Fault injected"), ("OK", "")]


def test_a_route_override_replaces_or_disables_the_listeners_fault(client: Any, plane: ControlPlane,
                                                                  backends: List[Backend]) -> None:
    with_fault(plane, abort(14))

    def overridden(config: Any) -> None:
        route = config.virtual_hosts[0].routes[0]
        route.typed_per_filter_config["fault"].CopyFrom(packed(abort(9)))
        quiet = config.virtual_hosts[0].routes.add()
        quiet.CopyFrom(route)
        del quiet.typed_per_filter_config["fault"]
        quiet.typed_per_filter_config["fault"].CopyFrom(packed(route_components_pb2.FilterConfig(
            config=packed(abort(14)), disabled=True)))
        route.match.path = UNARY
    serve(plane, {"c1": backends}, overridden)
    channel = client.channel("xds:///svc")
    settled(channel, grpc.StatusCode.FAILED_PRECONDITION)  # UNARY: the route's own config
    other = "/test.Echo/Other"
    assert channel.unary(other, b"x", timeout=10).code == grpc.StatusCode.UNIMPLEMENTED  # disabled: it went on
    assert [code for code, _ in grpcio_calls(plane, [[]])] == ["FAILED_PRECONDITION"]


def test_max_active_faults_lets_one_delay_at_a_time(client: Any, plane: ControlPlane,
                                                     backends: List[Backend]) -> None:
    serve(plane, {"c1": backends})
    with_fault(plane, delay(0.5, max_active_faults=wrappers_pb2.UInt32Value(value=1)))
    channel = client.channel("xds:///svc")
    until(lambda: [channel.unary(UNARY, b"x", timeout=0.2).code],
          lambda codes: codes == [grpc.StatusCode.DEADLINE_EXCEEDED])
    time.sleep(0.6)  # (the delay of the call that found the config is over: none is active)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        def timed(_: int) -> float:
            started = time.monotonic()
            assert channel.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.OK
            return time.monotonic() - started
        first = pool.submit(timed, 0)
        time.sleep(0.1)  # (the first call is in its delay)
        second = pool.submit(timed, 1)
        assert second.result() < 0.4 <= first.result()
