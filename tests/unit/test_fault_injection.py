"""Fault injection (gRFC A33) read and decided as grpcio's C-core does: the HTTPFault config and what it rejects,
HTTP statuses mapped as gRPC maps them, the headers that ask for a fault or lower its share, independent draws,
max_active_faults; and the call machine running a decision (the delay before its first attempt, the abort)."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("envoy")

from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2  # noqa: E402
from envoy.extensions.filters.http.fault.v3 import fault_pb2  # noqa: E402
from envoy.type.v3 import percent_pb2  # noqa: E402
from google.protobuf import duration_pb2, wrappers_pb2  # noqa: E402

from grpc_retry._backends.xds import fault  # noqa: E402
from grpc_retry._backends.xds.errors import Errors  # noqa: E402
from grpc_retry._core import END, START, TIMER, BufferPool, CallMachine, CallPolicy, Picker  # noqa: E402


def parsed(message: fault_pb2.HTTPFault) -> fault.Fault:
    errors = Errors("Listener", "svc")
    found = fault.parse(message.SerializeToString(), "f", errors)
    errors.raise_if_any()
    assert found is not None
    return found


def share(n: int, denominator: int = percent_pb2.FractionalPercent.HUNDRED) -> percent_pb2.FractionalPercent:
    return percent_pb2.FractionalPercent(numerator=n, denominator=denominator)


@pytest.mark.parametrize("status, code", [(400, 13), (401, 16), (403, 7), (404, 12), (429, 14), (502, 14),
                                          (503, 14), (504, 14), (500, 2), (200, 0)])
def test_an_http_status_is_mapped_as_grpc_maps_it(status: int, code: int) -> None:
    assert parsed(fault_pb2.HTTPFault(abort=fault_pb2.FaultAbort(http_status=status))).abort_code == code


def test_the_config_as_grpc_reads_it() -> None:
    config = parsed(fault_pb2.HTTPFault(
        delay=common_fault_pb2.FaultDelay(fixed_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000),
                                          percentage=share(25, percent_pb2.FractionalPercent.TEN_THOUSAND)),
        abort=fault_pb2.FaultAbort(grpc_status=14), max_active_faults=wrappers_pb2.UInt32Value(value=3)))
    assert config == fault.Fault(delay=1.5, delay_share=(25, 10_000), abort_code=14, abort_share=(0, 100),
                                 max_faults=3)
    errors = Errors("Listener", "svc")
    assert fault.parse(fault_pb2.HTTPFault(abort=fault_pb2.FaultAbort(grpc_status=17)).SerializeToString(), "f",
                       errors) is None
    with pytest.raises(Exception, match=r"f.abort.grpc_status.*invalid gRPC status code: 17"):
        errors.raise_if_any()


class Draws:
    """A scripted rng: randrange answers from `values` in turn."""

    def __init__(self, *values: int) -> None:
        self._values = list(values)

    def randrange(self, _: int) -> int:
        return self._values.pop(0)


def test_delay_and_abort_are_drawn_each_on_its_own() -> None:
    both = fault.Fault(delay=0.2, delay_share=(30, 100), abort_code=14, abort_share=(30, 100))
    assert fault.decide([both], None, Draws(10, 50)) == (0.2, 0)
    assert fault.decide([both], None, Draws(50, 10)) == (0.0, 14)
    never = fault.Fault(delay=0.2, abort_code=14)  # no percentage given: never
    assert fault.decide([never], None, random.Random(1)) == (0.0, 0)


def test_headers_ask_for_a_fault_and_lower_its_share_never_raise_it() -> None:
    header_abort = fault.Fault(abort_header=True, abort_share=(50, 100))
    assert fault.decide([header_abort], [("x-envoy-fault-abort-grpc-request", "9")], Draws(49)) == (0.0, 9)
    assert fault.decide([header_abort], [("x-envoy-fault-abort-grpc-request", "99")], Draws(0)) == (0.0, 2)
    assert fault.decide([header_abort], [("x-envoy-fault-abort-grpc-request", "9"),
                                         ("x-envoy-fault-abort-percentage", "100")], Draws(50)) == (0.0, 0)
    assert fault.decide([header_abort], [("x-envoy-fault-abort-grpc-request", "9"),
                                         ("x-envoy-fault-abort-percentage", "10")], Draws(10)) == (0.0, 0)
    header_delay = fault.Fault(delay_header=True, delay_share=(100, 100))
    assert fault.decide([header_delay], [("x-envoy-fault-delay-request", "250")]) == (0.25, 0)
    assert fault.decide([header_delay], [("x-envoy-fault-delay-request", "-5")]) == (0.0, 0)


def machine(delay: float, code: int, deadline: float = math.inf) -> CallMachine:
    policy = CallPolicy(max_attempts=3, retryable_codes=(14,))
    picker = Picker(0, 1)
    picker.set_state(0, 2)
    m = CallMachine(policy, None, BufferPool(1 << 20), picker, 1 << 20, deadline, random.random)
    m.fault_delay, m.fault_code = delay, code
    return m


def kinds(actions: list) -> list:
    return [a[0] for a in actions]


def test_the_machine_holds_the_first_attempt_for_the_delay_then_aborts() -> None:
    m = machine(0.3, 14)
    assert kinds(m.start(0.0, b"x")) == [TIMER]
    assert m.timer_at == pytest.approx(0.3)
    assert m.timer(0.3) == [(END, 14)] and m.reason_name == "fault_injected"
    m = machine(0.0, 14)
    assert m.start(0.0, b"x")[-1] == (END, 14)
    m = machine(0.3, 0)
    m.start(0.0, b"x")
    assert START in kinds(m.timer(0.3))
    m = machine(0.3, 14, deadline=0.1)  # the deadline comes first
    assert m.start(0.0, b"x") == [(TIMER, 0.1)]
    assert m.timer(0.1)[-1] == (END, 4)
