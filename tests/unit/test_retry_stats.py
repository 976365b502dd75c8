"""What `channel.retry_stats()` shows a person: the printed table, one method's few lines, the deprecated
`retry_attempts`, and the answer for a method that has no stats (no I/O: snapshots and a ChannelState)."""

import dataclasses
import json
import warnings
from types import MappingProxyType

import pytest

from grpc_retry import MethodStats
from grpc_retry._backends.outliers import OutlierStats
from grpc_retry._channel_state import ChannelState
from grpc_retry._stats import HISTOGRAM_BUCKETS, ChannelStats

SAY_HELLO = "/helloworld.Greeter/SayHello"
SAY_AGAIN = "/helloworld.Greeter/SayHelloAgain"


def histogram(*counts):
    return MappingProxyType(dict(zip(HISTOGRAM_BUCKETS, counts + (0,) * (8 - len(counts)), strict=True)))


RETRIED = MethodStats(calls=3, attempts=4, retries=1, histogram=histogram(1))
GAVE_UP = MethodStats(calls=1, attempts=3, retries=2, retry_attempts_failed=2, stopped_by_attempt_limit=1,
                      histogram=histogram(1, 1))


def test_the_table_has_one_row_per_method_under_its_headers():
    assert str(ChannelStats({SAY_HELLO: RETRIED, SAY_AGAIN: GAVE_UP}, None)).splitlines() == [
        "method                             calls attempts retries hedges transparent throttled  outcomes",
        "/helloworld.Greeter/SayHello           3        4       1      0           0         0  -",
        "/helloworld.Greeter/SayHelloAgain      1        3       2      0           0         0  max attempts 1",
    ]


def test_the_outcomes_name_what_stopped_or_committed_calls_and_the_outlier_line_follows():
    busy = MethodStats(calls=12345, attempts=23456, hedges=11111, transparent_retries=7, stopped_by_throttling=3,
                       stopped_by_pushback=2, committed_by_overflow=1, histogram=histogram(11111))
    outliers = OutlierStats(ejections_enforced_total=3, ejections_overflow=1, ejections_enforced_success_rate=2,
                            ejections_detected_success_rate=2, ejections_enforced_failure_percentage=1,
                            ejections_detected_failure_percentage=1, unejections=2, ejected=("10.0.0.7:443",))
    assert str(ChannelStats({SAY_HELLO: busy}, outliers)).splitlines() == [
        "method                        calls attempts retries hedges transparent throttled  outcomes",
        "/helloworld.Greeter/SayHello  12345    23456       0  11111           7         3  pushback 2, overflow 1",
        "outlier detection: 3 ejections (success rate 2, failure percentage 1), 2 returned",
        "  ejected now: 10.0.0.7:443; outliers left in for maxEjectionPercent: 1",
    ]


def test_a_typical_method_fits_in_100_columns():
    stats = MethodStats(calls=50000, attempts=120000, retries=70000, transparent_retries=1200,
                        stopped_by_throttling=40, stopped_by_attempt_limit=9000, histogram=histogram(40000, 30000))
    for line in str(ChannelStats({SAY_HELLO: stats}, None)).splitlines():
        assert len(line) <= 100, line


def test_no_stats_yet_says_so():
    assert str(ChannelStats({}, None)) == "no calls with a retry or hedging policy yet"


def test_one_method_prints_in_a_few_lines_with_the_histogram_spelled_out():
    assert str(GAVE_UP).splitlines() == [
        "1 call, 3 attempts: 2 retries (2 failed), 0 hedges, 0 transparent retries",
        "calls stopped by throttling 0, by pushback 0, at max attempts 1; committed by buffer overflow 0",
        "histogram (each retry counted once, by its number in its call): 1st 1, 2nd 1",
    ]
    hedged = MethodStats(calls=2, attempts=9, hedges=7, retry_attempts_failed=1, histogram=histogram(2, 2, 1, 1, 1),
                         hedging_delay=0.0125, hedges_not_sent_for_budget=4, attempts_timed_out=1)
    assert str(hedged).splitlines() == [
        "2 calls, 9 attempts: 0 retries, 7 hedges (1 failed), 0 transparent retries",
        "calls stopped by throttling 0, by pushback 0, at max attempts 0; committed by buffer overflow 0",
        "histogram (each hedge counted once, by its number in its call): 1st 2, 2nd 2, 3rd 1, 4th 1, 5th-9th 1",
        "attempts timed out 1, retries delayed by the server's RetryInfo 0",
        "hedging delay now 12.5 ms, hedges not sent for max_extra_load 4",
    ]


def test_repr_shows_only_what_is_not_zero():
    assert repr(GAVE_UP) == ("MethodStats(calls=1, attempts=3, retries=2, retry_attempts_failed=2, "
                             "stopped_by_attempt_limit=1, histogram={'>=1': 1, '>=2': 1})")
    assert repr(MethodStats()) == "MethodStats()"
    assert repr(ChannelStats({SAY_HELLO: MethodStats(calls=1, attempts=1)}, None)) == (
        "ChannelStats({'/helloworld.Greeter/SayHello': MethodStats(calls=1, attempts=1)}, outlier_detection=None)")


def test_zeros_are_the_defaults_and_compare_equal_to_a_snapshot_of_zeros():
    assert MethodStats() == MethodStats(histogram=histogram())
    assert dict(MethodStats().histogram) == dict.fromkeys(HISTOGRAM_BUCKETS, 0)


def test_retry_attempts_is_deprecated_and_no_longer_a_field():
    assert "retry_attempts" not in {f.name for f in dataclasses.fields(MethodStats)}
    assert "retry_attempts=" not in repr(GAVE_UP)
    with pytest.warns(DeprecationWarning, match=r"retry_attempts is deprecated: use retries \+ hedges") as caught:
        assert GAVE_UP.retry_attempts == 2
    assert caught[0].filename == __file__  # the warning points at the reader, not at grpc_retry
    with pytest.warns(DeprecationWarning):
        assert MethodStats(hedges=5).retry_attempts == 5


def state(config, **options):
    return ChannelState("127.0.0.1:1", [("grpc.service_config", json.dumps(config)), *options.items()])


RETRY_GREETER = {"methodConfig": [{"name": [{"service": "helloworld.Greeter"}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]}


def test_a_covered_method_not_called_yet_reads_as_zeros_and_is_not_listed():
    ch = state(RETRY_GREETER)
    stats = ch.retry_stats()
    assert stats[SAY_HELLO] == MethodStats() and SAY_HELLO in stats
    assert list(stats) == [] and len(stats) == 0
    assert list(ch.retry_stats()) == []  # reading did not add it
    ch.policy(SAY_AGAIN)  # as a first call does
    assert list(ch.retry_stats()) == [SAY_AGAIN]


def test_a_method_no_policy_covers_raises_a_key_error_that_says_why():
    ch = state(RETRY_GREETER)
    ch.policy(SAY_HELLO)
    stats = ch.retry_stats()
    with pytest.raises(KeyError) as info:
        stats["/shop.Inventory/Get"]
    assert info.value.args[0] == (
        "no retry stats for '/shop.Inventory/Get': no retry or hedging policy covers it on this channel (the "
        "service config gives it no retryPolicy or hedgingPolicy); methods with stats: "
        "'/helloworld.Greeter/SayHello'")
    assert "/shop.Inventory/Get" not in stats and stats.get("/shop.Inventory/Get") is None
    with pytest.raises(KeyError, match="a method's name looks like '/package.Service/Method'"):
        stats["helloworld.Greeter/SayHello"]


def test_with_retries_off_the_key_error_says_so():
    ch = state(RETRY_GREETER, **{"grpc.enable_retries": 0})
    with pytest.raises(KeyError, match=r"\(grpc.enable_retries is 0\); methods with stats: none yet"):
        ch.retry_stats()[SAY_HELLO]


def test_no_warning_is_raised_by_printing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        str(GAVE_UP), repr(GAVE_UP), str(ChannelStats({SAY_HELLO: GAVE_UP}, None))
