"""Attempts that hang: retryPolicy.perAttemptRecvTimeout, and the delay a server's google.rpc.RetryInfo asks for,
over real grpcio servers on loopback, through both APIs (the `client` fixture). A black-holed backend accepts the
call and never answers (a held step)."""

import asyncio
import concurrent.futures
import json
import time

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Step, fail
from support.clients import retry_options, retry_policy

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
STALL = Step(wait=0)  # holds the attempt until the client gives up on it
RECV_TIMEOUT_DETAILS = "Stream removed (retry perAttemptRecvTimeout exceeded)"  # grpcio 1.85's words
CALLS = [
    ("unary", UNARY, b"req"),
    ("server_stream", SERVER_STREAM, b"req"),
    ("client_stream", CLIENT_STREAM, [b"a", b"b"]),
    ("bidi", BIDI, [b"a", b"b"]),
]


def timed(recv="0.2s", **kw):
    policy = retry_policy(**kw)
    if recv is not None:
        policy["perAttemptRecvTimeout"] = recv
    return policy


def ipv4(backends):
    return "ipv4:" + ",".join(b.target for b in backends)


def round_robin(policy):
    return retry_options(policy, options=[("grpc.lb_policy_name", "round_robin")])


def in_flight(ch, calls, concurrency, timeout):
    """`calls` unary calls, `concurrency` at a time: each one's outcome and its latency."""
    def one(i):
        started = time.monotonic()
        out = ch.unary(UNARY, b"%d" % i, timeout=timeout)
        return out, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(calls)))


def test_a_black_holed_backend_costs_a_per_attempt_timeout_not_the_deadline(client, backends):
    backends[1].fallback(UNARY, lambda i: STALL)
    ch = client.channel(ipv4(backends), round_robin(timed(max_attempts=3)))
    results = in_flight(ch, 30, 6, timeout=3)
    assert [out.code for out, _ in results] == [OK] * 30
    latencies = sorted(latency for _, latency in results)
    assert latencies[-1] < 1.0, latencies[-5:]  # (the p99 of 30 calls is the slowest)
    stalled = backends[1].attempts_of(UNARY)
    assert stalled and all(a.previous is None or a.previous in "12" for a in stalled)
    backends[1].wait_all_ended(UNARY)  # each stalled attempt was cancelled, none left behind
    assert all(a.cancelled for a in backends[1].attempts_of(UNARY))


def test_without_the_setting_the_same_calls_end_at_the_deadline(client, backends):
    backends[0].fallback(UNARY, lambda i: STALL)
    backends[1].fallback(UNARY, lambda i: STALL)
    backends[2].fallback(UNARY, lambda i: STALL)
    ch = client.channel(ipv4(backends), round_robin(timed(recv=None, max_attempts=3)))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=0.6)
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.55 < time.monotonic() - started < 2.0
    assert sum(len(b.attempts_of(UNARY)) for b in backends) == 1


@pytest.mark.parametrize("kind,method,payload", CALLS, ids=[c[0] for c in CALLS])
def test_when_every_backend_stalls_the_call_ends_after_max_attempts_one_per_backend(client, backends, kind,
                                                                                    method, payload):
    for backend in backends:
        backend.fallback(method, lambda i: STALL)
    ch = client.channel(ipv4(backends), round_robin(timed(max_attempts=3)))
    started = time.monotonic()
    out = getattr(ch, kind)(method, payload, timeout=5)
    took = time.monotonic() - started
    assert (out.code, out.details) == (grpc.StatusCode.CANCELLED, RECV_TIMEOUT_DETAILS)
    assert 0.6 <= took < 2.5, took
    assert [len(b.attempts_of(method)) for b in backends] == [1, 1, 1]
    assert sorted(b.attempts_of(method)[0].previous or "0" for b in backends) == ["0", "1", "2"]


def test_headers_commit_the_call_and_stop_the_timer(client, backend):
    # Response headers, then silence past the deadline: the call is the attempt's (as on grpcio).
    backend.script(UNARY, Step(headers=(("x-h", "1"),), headers_lead=3.0))
    ch = client.channel(backend.target, retry_options(timed(max_attempts=3)))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=1.5)
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started > 1.4
    assert len(backend.attempts_of(UNARY)) == 1


def test_a_response_stream_that_stalls_before_its_first_message_is_retried(client, backend):
    backend.script(SERVER_STREAM, STALL)
    ch = client.channel(backend.target, retry_options(timed(max_attempts=3)))
    out = ch.server_stream(SERVER_STREAM, b"r", timeout=5)
    assert out.code == OK and out.responses == [b"r#0", b"r#1", b"r#2"]
    assert [a.previous for a in backend.attempts_of(SERVER_STREAM)] == [None, "1"]


def test_empty_retryable_codes_with_the_setting_are_accepted_and_stalls_retried(client, backend):
    backend.script(UNARY, STALL)
    ch = client.channel(backend.target, retry_options(timed(codes=())))
    out = ch.unary(UNARY, b"x", timeout=5)
    assert out.code == OK
    assert len(backend.attempts_of(UNARY)) == 2
    backend.script(UNARY, fail())  # ... and no status is retried
    assert ch.unary(UNARY, b"x", timeout=5).code == UNAVAILABLE


def test_retry_stats_count_the_timed_out_attempts(client, backend):
    backend.script(UNARY, STALL, STALL)
    ch = client.channel(backend.target, retry_options(timed(max_attempts=3)))
    assert ch.unary(UNARY, b"x", timeout=5).code == OK
    stats = ch.channel.retry_stats()[UNARY]
    assert (stats.attempts_timed_out, stats.retries, stats.retry_attempts_failed) == (2, 2, 1)


# -- RetryInfo ----------------------------------------------------------------------------------------------------

def retry_info(seconds):
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(seconds * 1e9))
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=UNAVAILABLE.value[0], message="busy", details=[detail])
    return fail(details="busy", trailing=(("grpc-status-details-bin", status.SerializeToString()),))


def test_retry_info_sets_the_delay_before_the_next_attempt(client, backend):
    backend.script(UNARY, retry_info(0.3))
    ch = client.channel(backend.target, retry_options(retry_policy(initial="5s", maximum="5s")))
    out = ch.unary(UNARY, b"x", timeout=5)
    assert out.code == OK
    first, second = backend.attempts_of(UNARY)
    # 0.3 s ± 50 ms, as the server sees it: plus the status's trip back and the next attempt's (loaded CI: 50 ms)
    assert 0.25 <= second.arrived - first.ended <= 0.4, second.arrived - first.ended


def test_a_retry_info_delay_past_the_deadline_ends_the_call_at_once(client, backend):
    backend.script(UNARY, retry_info(10))
    ch = client.channel(backend.target, retry_options())
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=2)
    assert (out.code, out.details) == (UNAVAILABLE, "busy")
    assert time.monotonic() - started < 0.5
    assert len(backend.attempts_of(UNARY)) == 1


def test_a_retry_info_delay_over_the_cap_ends_the_call(client, backend):
    backend.script(UNARY, retry_info(2))
    options = retry_options(options=[("grpc_retry.max_server_delay", 1)])
    ch = client.channel(backend.target, options)
    assert ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE
    assert len(backend.attempts_of(UNARY)) == 1


def test_malformed_details_get_the_normal_backoff(client, backend):
    backend.script(UNARY, fail(details="busy", trailing=(("grpc-status-details-bin", b"\x1a\x05abc"),)))
    ch = client.channel(backend.target, retry_options())
    assert ch.unary(UNARY, b"x", timeout=5).code == OK
    first, second = backend.attempts_of(UNARY)
    assert second.arrived - first.ended < 0.2


def test_the_setting_is_read_from_a_json_service_config_as_grpcio_writes_it(client, backend):
    config = {"methodConfig": [{"name": [{}], "retryPolicy": {
        "maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
        "perAttemptRecvTimeout": "0.1s"}}]}
    backend.script(UNARY, STALL)
    ch = client.channel(backend.target, [("grpc.service_config", json.dumps(config))])
    assert ch.unary(UNARY, b"x", timeout=5).code == OK


def test_a_server_that_sends_headers_ahead_keeps_its_answers_past_the_first_calls(client, backend):
    # Past a method's first calls, a timed unary attempt is one batch (its headers seen with its response) unless
    # its server was seen sending headers ahead: this one always does, so no call is cut at its timer.
    backend.fallback(UNARY, lambda i: Step(headers=(("x-h", "1"),), headers_lead=0.5))
    ch = client.channel(backend.target, retry_options(timed(recv="0.25s", max_attempts=3)))
    results = in_flight(ch, 40, 8, timeout=5)
    assert [out.code for out, _ in results] == [OK] * 40
    assert len(backend.attempts_of(UNARY)) == 40


@pytest.mark.parametrize("kind,method,payload", CALLS, ids=[c[0] for c in CALLS])
def test_non_blocking_calls_retry_a_stalled_attempt(client, backend, kind, method, payload):
    # (sync: .future() for unary responses, the response iterator for streams; asyncio: the call's task)
    backend.script(method, STALL)
    ch = client.channel(backend.target, retry_options(timed(max_attempts=3)))
    handles = [ch.start_call(kind, method, payload, timeout=5) for _ in range(3)]
    outcomes = [handle.result() for handle in handles]
    assert [out.code for out in outcomes] == [OK] * 3
    assert len(backend.attempts_of(method)) == 4  # the stalled one, retried once


def test_plain_blocking_calls_past_a_methods_first_calls_are_timed_too(client, backends):
    # (sync: the bare multicallable(...), whose attempts past the method's first calls are one batch each, their
    # timer their grpcio deadline)
    backends[1].fallback(UNARY, lambda i: STALL)
    ch = client.channel(ipv4(backends), round_robin(timed(recv="0.1s", max_attempts=3)))
    unary = ch.multicallable("unary", UNARY)
    outcomes = [ch.invoke("unary", unary, b"x", timeout=3, plain=True) for _ in range(40)]
    assert [out.code for out in outcomes] == [OK] * 40
    assert len(backends[1].attempts_of(UNARY)) >= 10


@pytest.mark.parametrize("kind,method,payload", CALLS[:2], ids=[c[0] for c in CALLS[:2]])
def test_an_answer_held_up_behind_a_busy_event_loop_still_counts(client, backend, kind, method, payload):
    # asyncio: the loop is blocked past the timer while the answer comes; both wait for it, and the answer that
    # came first wins (C-core stops the timer on its own thread).
    if client.api != "aio":
        pytest.skip("asyncio only: a sync call has no event loop to be held up behind")
    ch = client.channel(backend.target, retry_options(timed(recv="0.1s", max_attempts=3)))
    assert getattr(ch, kind)(method, payload, timeout=5).code == OK  # (connected)

    async def blocked_call():
        arrived = len(backend.attempts_of(method)) + 1
        call = ch.multicallable(kind, method)(payload, timeout=5)
        while len(backend.attempts_of(method)) < arrived:  # (the portable transport's starts on a loop turn)
            await asyncio.sleep(0.001)
        time.sleep(0.5)  # the loop blocked: the answer comes, the timer falls due
        if kind == "unary":
            return await call
        return [message async for message in call]

    for _ in range(3):
        before = len(backend.attempts_of(method))
        client.run_in_loop(blocked_call())
        assert len(backend.attempts_of(method)) == before + 1  # no retry: the attempt answered in time
