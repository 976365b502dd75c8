"""An xDS cluster's retry budget: its DEFAULT circuit-breaker threshold's `retry_budget` (Envoy's defaults) and an
explicit `max_retries`, decoded from a Cluster resource (a bad one NACKed with its field), and kept per cluster
(retry_budget.py): a new budget when its settings change, the same one (and its count) when they do not."""

from __future__ import annotations

from typing import Any, Callable

import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import cluster_pb2  # noqa: E402
from envoy.config.core.v3 import base_pb2, config_source_pb2  # noqa: E402
from envoy.type.v3 import percent_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402

from grpc_retry._backends.xds import clusters  # noqa: E402
from grpc_retry._backends.xds.cluster_impl import ClusterImpl  # noqa: E402
from grpc_retry._backends.xds.errors import ResourceError  # noqa: E402
from grpc_retry._budget import UNBOUNDED, RetryBudgetSettings  # noqa: E402
from grpc_retry._core import RetryBudget  # noqa: E402


def decoded(edit: Callable[[Any], None]) -> Any:
    message = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS, eds_cluster_config=(
        cluster_pb2.Cluster.EdsClusterConfig(eds_config=config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource()))))
    edit(message.circuit_breakers)
    return clusters.decode(message.SerializeToString())[1]


def threshold(breakers: Any, priority: int = base_pb2.DEFAULT) -> Any:
    added = breakers.thresholds.add()
    added.priority = priority
    return added


def test_a_clusters_retry_budget_and_max_retries_are_its_concurrency_budget() -> None:
    assert decoded(lambda b: None).retry_budget is None
    assert decoded(lambda b: threshold(b).retry_budget.SetInParent()).retry_budget == \
        RetryBudgetSettings(True, 20.0, 3)  # (Envoy's defaults)

    def both(breakers: Any) -> None:
        t = threshold(breakers)
        t.retry_budget.budget_percent.CopyFrom(percent_pb2.Percent(value=12.5))
        t.retry_budget.min_retry_concurrency.CopyFrom(wrappers_pb2.UInt32Value(value=1))
        t.max_retries.CopyFrom(wrappers_pb2.UInt32Value(value=4))
    assert decoded(both).retry_budget == RetryBudgetSettings(True, 12.5, 1, max_in_flight=4)
    cap = decoded(lambda b: threshold(b).max_retries.CopyFrom(wrappers_pb2.UInt32Value(value=2))).retry_budget
    assert cap == RetryBudgetSettings(True, 100.0, UNBOUNDED, max_in_flight=2)
    assert cap.describe() == "retries in flight at most 2"
    # Only the DEFAULT priority's threshold counts.
    assert decoded(lambda b: threshold(b, base_pb2.HIGH).retry_budget.SetInParent()).retry_budget is None


def test_a_budget_percent_out_of_range_is_nacked_with_its_field() -> None:
    def bad(breakers: Any) -> None:
        threshold(breakers).retry_budget.budget_percent.CopyFrom(percent_pb2.Percent(value=150))
    with pytest.raises(ResourceError, match="circuit_breakers.thresholds.retry_budget.budget_percent"):
        decoded(bad)


def test_the_max_in_flight_cap_holds_whatever_the_percentage_allows() -> None:
    budget = RetryBudget(True, 100.0, 10, max_in_flight=2)
    for _ in range(10):
        budget.call_started(0.0)
    assert [budget.try_retry(0.0) for _ in range(3)] == [True, True, False]
    budget.retry_ended()
    assert budget.try_retry(0.0)


def test_a_cluster_keeps_its_budget_until_its_settings_change() -> None:
    impl = ClusterImpl()
    assert impl.budget is None
    impl.retries.update(RetryBudgetSettings(True, 20.0, 3))
    first = impl.budget
    assert first is not None
    impl.retries.update(RetryBudgetSettings(True, 20.0, 3))
    assert impl.budget is first
    impl.retries.update(RetryBudgetSettings(True, 50.0, 3))
    assert impl.budget is not first and impl.budget is not None and impl.budget.percent == 50.0
    impl.retries.update(None)
    assert impl.budget is None

