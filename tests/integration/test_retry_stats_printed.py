"""`print(channel.retry_stats())` after real retried calls on a loopback grpcio server, through both APIs: the
table's numbers are what crossed the wire."""

import grpc
import pytest
from support.backend import UNARY, Step, fail
from support.clients import retry_options, retry_policy

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_the_printed_table_counts_a_retried_call_and_one_that_ran_out_of_attempts(client, backend, capsys):
    backend.script(UNARY, fail(), fail(), Step(), fail(), fail(), fail())
    ch = client.channel(backend.target, retry_options(retry_policy(max_attempts=3)))
    assert ch.unary(UNARY, b"x", timeout=10).code == OK
    assert ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE
    assert len(backend.attempts_of(UNARY)) == 6

    stats = ch.channel.retry_stats()
    print(stats)
    print(stats[UNARY])
    assert capsys.readouterr().out.splitlines() == [
        "method                       calls attempts retries hedges transparent throttled  outcomes",
        "/grpc_retry.test.Echo/Unary      2        6       4      0           0         0  max attempts 1",
        "2 calls, 6 attempts: 4 retries (3 failed), 0 hedges, 0 transparent retries",
        "calls stopped by throttling 0, by pushback 0, at max attempts 1; committed by buffer overflow 0",
        "histogram (each retry counted once, by its number in its call): 1st 2, 2nd 2",
    ]
    assert dict(stats[UNARY].histogram) == {">=1": 2, ">=2": 2, ">=3": 0, ">=4": 0, ">=5": 0, ">=10": 0,
                                            ">=100": 0, ">=1000": 0}


def test_a_method_with_no_policy_has_no_row_and_says_why(client, backend):
    ch = client.channel(backend.target, retry_options(name=[{"service": "other.Service"}]))
    assert ch.unary(UNARY, b"x", timeout=10).code == OK
    stats = ch.channel.retry_stats()
    assert str(stats) == "no calls with a retry or hedging policy yet"
    with pytest.raises(KeyError, match="no retry or hedging policy covers it on this channel"):
        stats[UNARY]
    assert stats["/other.Service/Method"].calls == 0  # covered, not called yet: zeros
