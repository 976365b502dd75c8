"""The retry policy over real grpcio servers on loopback, through both grpc_retry APIs (the `client` fixture).

Each test scripts what the server does per attempt (tests/support/backend.py) and asserts on what crossed the
wire (the attempts the server saw, their metadata and requests) and on what the application got."""

import time

import grpc
import pytest
from support.backend import BIDI, CLIENT_STREAM, SERVER_END_LAG, SERVER_STREAM, UNARY, Step, fail, pushback
from support.clients import retry_options, retry_policy, service_config

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
OK = grpc.StatusCode.OK

# kind, method, request payload, expected responses on an echo
CALLS = [
    ("unary", UNARY, b"req", [b"req"]),
    ("server_stream", SERVER_STREAM, b"req", [b"req#0", b"req#1", b"req#2"]),
    ("client_stream", CLIENT_STREAM, [b"a", b"b", b"c"], [b"a|b|c"]),
    ("bidi", BIDI, [b"a", b"b", b"c"], [b"a", b"b", b"c"]),
]
IDS = [c[0] for c in CALLS]


def _call(ch, kind, method, payload, **kw):
    return getattr(ch, kind)(method, payload, **kw)


def until(condition, timeout=10.0):
    """Whether `condition()` came to hold within `timeout` seconds (for a state of the client that no event
    tells: looked at every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("kind,method,payload,expected", CALLS, ids=IDS)
def test_retries_until_success_on_every_cardinality(client, backend, kind, method, payload, expected):
    backend.script(method, fail(), fail())
    ch = client.channel(backend.target, retry_options(retry_policy(max_attempts=3)))
    out = _call(ch, kind, method, payload, timeout=10)
    assert out.code == OK
    assert out.responses == expected
    attempts = backend.attempts_of(method)
    assert [a.previous for a in attempts] == [None, "1", "2"]
    assert out.previous_attempts == "2"
    if kind in ("client_stream", "bidi"):
        # Every attempt got the whole request stream, in order: the replay buffer.
        assert [a.requests for a in attempts][-1] == payload


@pytest.mark.parametrize("kind,method,payload,expected", CALLS, ids=IDS)
def test_gives_up_after_max_attempts_with_the_last_status(client, backend, kind, method, payload, expected):
    backend.fallback(method, lambda i: fail(details=f"attempt {i}", trailing=(("x-attempt", str(i)),)))
    ch = client.channel(backend.target, retry_options(retry_policy(max_attempts=4)))
    out = _call(ch, kind, method, payload, timeout=10)
    assert out.code == UNAVAILABLE
    assert out.details == "attempt 3"
    assert out.trailing["x-attempt"] == "3"
    assert out.previous_attempts == "3"
    assert len(backend.attempts_of(method)) == 4


def test_first_attempt_success_carries_no_attempt_metadata(client, backend):
    ch = client.channel(backend.target, retry_options())
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK and out.previous_attempts is None
    assert backend.attempts_of(UNARY)[0].previous is None


def test_non_retryable_status_is_returned_at_once(client, backend):
    backend.script(UNARY, fail(grpc.StatusCode.INVALID_ARGUMENT, "bad"))
    ch = client.channel(backend.target, retry_options())
    out = ch.unary(UNARY, b"x", timeout=10)
    assert (out.code, out.details) == (grpc.StatusCode.INVALID_ARGUMENT, "bad")
    assert out.previous_attempts is None
    assert len(backend.attempts_of(UNARY)) == 1


def test_max_attempts_above_the_client_cap_is_clamped(client, backend):
    backend.fallback(UNARY, lambda i: fail())
    options = retry_options(retry_policy(max_attempts=9), options=[("grpc_retry.max_attempts", 3)])
    out = client.channel(backend.target, options).unary(UNARY, b"x", timeout=10)
    assert out.code == UNAVAILABLE
    assert len(backend.attempts_of(UNARY)) == 3


def test_enable_retries_0_turns_retries_off(client, backend):
    backend.fallback(UNARY, lambda i: fail())
    options = retry_options(retry_policy(max_attempts=5), options=[("grpc.enable_retries", 0)])
    out = client.channel(backend.target, options).unary(UNARY, b"x", timeout=10)
    assert out.code == UNAVAILABLE
    assert len(backend.attempts_of(UNARY)) == 1


def test_no_service_config_means_no_retries(client, backend):
    backend.script(UNARY, fail())
    out = client.channel(backend.target).unary(UNARY, b"x", timeout=10)
    assert out.code == UNAVAILABLE
    assert len(backend.attempts_of(UNARY)) == 1


def test_method_specific_config_wins_over_service_config(client, backend):
    # The service retries UNAVAILABLE; Unary alone has no policy (most specific name wins).
    config = service_config(retry_policy(), extra_method_configs=[
        {"name": [{"service": "grpc_retry.test.Echo", "method": "Unary"}], "timeout": "5s"}])
    backend.script(UNARY, fail())
    backend.script(SERVER_STREAM, fail())
    ch = client.channel(backend.target, [("grpc.service_config", config)])
    assert ch.unary(UNARY, b"x").code == UNAVAILABLE
    assert ch.server_stream(SERVER_STREAM, b"x", timeout=10).code == OK
    assert (len(backend.attempts_of(UNARY)), len(backend.attempts_of(SERVER_STREAM))) == (1, 2)


# -- commit: Trailers-Only vs headers, responses ---------------------------------------------------------


@pytest.mark.parametrize("kind,method,payload,expected", CALLS, ids=IDS)
def test_response_headers_commit_the_call(client, backend, kind, method, payload, expected):
    # Headers with metadata, then UNAVAILABLE: the application may have seen the headers, so no retry. The
    # status follows the headers by 0.2 s: grpc.aio reports headers that arrive with the status as empty, and
    # such an attempt is taken as Trailers-Only (README).
    backend.script(method, fail(headers=(("x-h", "1"),), headers_lead=0.2))
    ch = client.channel(backend.target, retry_options())
    out = _call(ch, kind, method, payload, timeout=10)
    assert out.code == UNAVAILABLE
    assert out.initial.get("x-h") == "1"
    assert len(backend.attempts_of(method)) == 1


@pytest.mark.parametrize("kind,method,payload", [
    ("server_stream", SERVER_STREAM, b"req"), ("bidi", BIDI, [b"a", b"b"])], ids=["server_stream", "bidi"])
def test_a_response_message_commits_the_call(client, backend, kind, method, payload):
    backend.script(method, Step(code=UNAVAILABLE, details="after one", responses=1, read=1))
    ch = client.channel(backend.target, retry_options())
    out = _call(ch, kind, method, payload, timeout=10)
    assert out.code == UNAVAILABLE and out.details == "after one"
    assert len(out.responses) == 1
    assert len(backend.attempts_of(method)) == 1


@pytest.mark.parametrize("read", ["late", "never"])
def test_a_first_message_read_after_its_status_came_commits_the_call(client, backend, read):
    # The message and the status are both in before the application reads: grpcio holds the status until the
    # message is read (or the deadline passes), so the message commits the call, and no retry goes out.
    backend.script(BIDI, Step(code=UNAVAILABLE, details="after one", responses=1, read=1))
    ch = client.channel(backend.target, retry_options())
    if client.api == "aio":
        async def start():
            return ch.channel.stream_stream(BIDI)(iter([b"a", b"b"]), timeout=2)

        async def outcome(call):
            got = []
            if read == "late":
                try:
                    async for message in call:
                        got.append(message)
                except grpc.aio.AioRpcError:
                    pass
            return got, await call.code()

        call = ch.run(start())
        backend.wait_ended(BIDI, 1)
        time.sleep(0.2)  # (its status reaches the client a moment after the server's end)
        got, code = ch.run(outcome(call))
    else:
        call = ch.channel.stream_stream(BIDI)(iter([b"a", b"b"]), timeout=2)
        backend.wait_ended(BIDI, 1)
        time.sleep(0.2)
        got = []
        if read == "late":
            try:
                for message in call:
                    got.append(message)
            except grpc.RpcError:
                pass
        code = call.code()
    expected = ([b"a"], UNAVAILABLE) if read == "late" else ([], grpc.StatusCode.DEADLINE_EXCEEDED)
    assert (got, code) == expected
    assert len(backend.attempts_of(BIDI)) == 1


# -- pushback --------------------------------------------------------------------------------------------


def test_pushback_sets_the_delay_exactly(client, backend):
    # Backoff would be ~0 (initial 1ms); the server says 400 ms.
    backend.script(UNARY, pushback(400))
    ch = client.channel(backend.target, retry_options(retry_policy(initial="0.001s", maximum="0.001s")))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK
    first, second = backend.attempts_of(UNARY)
    # The server notes an attempt's end just after its status has left: the client's 400 ms start a moment sooner.
    assert 0.4 - SERVER_END_LAG <= second.arrived - first.ended < 3.0


def test_pushback_overrides_a_long_backoff(client, backend):
    backend.script(UNARY, pushback(0))
    ch = client.channel(backend.target, retry_options(retry_policy(initial="20s", maximum="20s")))
    started = time.monotonic()
    assert ch.unary(UNARY, b"x", timeout=15).code == OK
    assert time.monotonic() - started < 5.0
    assert len(backend.attempts_of(UNARY)) == 2


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", ""])
def test_bad_pushback_stops_retrying(client, backend, value):
    backend.script(UNARY, fail(trailing=(("grpc-retry-pushback-ms", value),)))
    ch = client.channel(backend.target, retry_options())
    assert ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE
    assert len(backend.attempts_of(UNARY)) == 1


# -- replay buffer ---------------------------------------------------------------------------------------


def test_client_stream_replays_in_order_after_a_failure_mid_stream(client, backend):
    # The first attempt reads two requests, then fails; the retry must get all four, in order.
    backend.script(CLIENT_STREAM, fail(read=2, read_all=True))
    ch = client.channel(backend.target, retry_options())
    out = ch.client_stream(CLIENT_STREAM, [b"1", b"2", b"3", b"4"], timeout=10)
    assert out.code == OK and out.response == b"1|2|3|4"
    first, second = backend.attempts_of(CLIENT_STREAM)
    assert first.requests == [b"1", b"2"]
    assert second.requests == [b"1", b"2", b"3", b"4"]


def test_buffer_overflow_commits_and_the_attempt_continues(client, backend):
    # 8 bytes of buffer: the third 4-byte message overflows it, so the call commits to the first attempt.
    backend.script(CLIENT_STREAM, fail())
    options = retry_options(options=[("grpc.per_rpc_retry_buffer_size", 8)])
    ch = client.channel(backend.target, options)
    out = ch.client_stream(CLIENT_STREAM, [b"aaaa", b"bbbb", b"cccc", b"dddd"], timeout=10)
    assert out.code == UNAVAILABLE
    assert len(backend.attempts_of(CLIENT_STREAM)) == 1
    assert ch.state.pool.used == 0


def test_overflow_mid_stream_after_the_attempt_began(client, backend):
    # The server holds the first attempt until it has read 2 messages; the 3rd overflows; then it fails.
    gate_event = backend.event_when(lambda: len(backend.attempts_of(BIDI)) == 1
                                    and len(backend.attempts_of(BIDI)[0].requests) >= 2)
    from support.clients import Gate

    backend.script(BIDI, fail(read=3, read_all=True))
    options = retry_options(options=[("grpc.per_rpc_retry_buffer_size", 10)])
    ch = client.channel(backend.target, options)
    out = ch.bidi(BIDI, [b"aaaa", b"bbbb", Gate(gate_event), b"cccc"], timeout=10)
    assert out.code == UNAVAILABLE
    attempts = backend.attempts_of(BIDI)
    assert len(attempts) == 1 and attempts[0].requests == [b"aaaa", b"bbbb", b"cccc"]
    assert ch.state.pool.used == 0


def test_channel_wide_buffer_overflow_commits(client, backend):
    backend.script(CLIENT_STREAM, fail())
    options = retry_options(options=[("grpc_retry.retry_buffer_size", 5)])
    ch = client.channel(backend.target, options)
    out = ch.client_stream(CLIENT_STREAM, [b"abc", b"def"], timeout=10)
    assert out.code == UNAVAILABLE
    assert len(backend.attempts_of(CLIENT_STREAM)) == 1


# -- deadline and cancellation ---------------------------------------------------------------------------


def test_deadline_covers_backoff(client, backend):
    backend.fallback(UNARY, lambda i: fail())
    ch = client.channel(backend.target, retry_options(retry_policy(max_attempts=5, initial="30s", maximum="30s")))
    # With rng fixed to 1.0 the first backoff is exactly 30 s: far past the 0.5 s deadline.
    ch.state.rng = lambda: 1.0
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=0.5)
    elapsed = time.monotonic() - started
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.4 <= elapsed < 5.0
    assert len(backend.attempts_of(UNARY)) == 1


def test_deadline_during_an_attempt(client, backend):
    backend.script(UNARY, Step(wait=0))  # hold until the client gives up
    ch = client.channel(backend.target, retry_options())
    out = ch.unary(UNARY, b"x", timeout=0.5)
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED
    backend.wait_ended(UNARY, 1)
    assert len(backend.attempts_of(UNARY)) == 1


def test_method_timeout_applies_when_sooner(client, backend):
    backend.script(UNARY, Step(wait=0))
    ch = client.channel(backend.target, [("grpc.service_config", service_config(retry_policy(), timeout="0.3s"))])
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=30)
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 10


def test_cancel_during_backoff(client, backend):
    backend.fallback(UNARY, lambda i: fail())
    ch = client.channel(backend.target, retry_options(retry_policy(initial="30s", maximum="30s")))
    ch.state.rng = lambda: 1.0
    handle = ch.start_call("unary", UNARY, b"x", timeout=60)
    backend.wait_ended(UNARY, 1)
    assert until(lambda: handle.call._machine.state_name == "BACKOFF")  # the client saw the failure
    assert handle.cancel()
    out = handle.result(10)
    assert out.code == grpc.StatusCode.CANCELLED
    assert len(backend.attempts_of(UNARY)) == 1
    assert handle.done_callbacks == [1]


@pytest.mark.parametrize("kind,method,payload", [
    ("unary", UNARY, b"x"), ("server_stream", SERVER_STREAM, b"x"), ("bidi", BIDI, [b"x"])],
    ids=["unary", "server_stream", "bidi"])
def test_cancel_during_an_attempt(client, backend, kind, method, payload):
    backend.script(method, Step(wait=0))
    ch = client.channel(backend.target, retry_options())
    handle = ch.start_call(kind, method, payload, timeout=60)
    backend.wait_attempts(method, 1)
    handle.cancel()
    out = handle.result(10)
    assert out.code == grpc.StatusCode.CANCELLED
    (attempt,) = backend.wait_ended(method, 1)
    assert attempt.cancelled
    assert handle.done_callbacks == [1]


# -- throttling -------------------------------------------------------------------------------------------


def test_throttling_sequence_computed_by_hand(client, backend):
    # maxTokens 3, tokenRatio 0.5: tokens start at 3; each retryable failure costs 1, each success adds 0.5.
    # Retries are allowed only while tokens > 1.5.
    #   call 1: fail (3 -> 2, 2 > 1.5: retry), OK (2 -> 2.5)          2 attempts
    #   call 2: fail (2.5 -> 1.5: not > 1.5, no retry)                  1 attempt, UNAVAILABLE
    #   call 3: OK (1.5 -> 2.0)                                         1 attempt
    #   call 4: fail (2 -> 1, no retry)                                 1 attempt, UNAVAILABLE
    target = backend.target
    config = service_config(retry_policy(max_attempts=5), throttling={"maxTokens": 3, "tokenRatio": 0.5})
    ch = client.channel(target, [("grpc.service_config", config)])
    backend.script(UNARY, fail(), Step(), fail(), Step(), fail())
    codes = [ch.unary(UNARY, b"x", timeout=10).code for _ in range(4)]
    assert codes == [OK, UNAVAILABLE, OK, UNAVAILABLE]
    assert len(backend.attempts_of(UNARY)) == 5
    assert ch.throttle_tokens == pytest.approx(1.0)


def test_non_retryable_failures_do_not_cost_tokens(client, backend):
    config = service_config(retry_policy(), throttling={"maxTokens": 2, "tokenRatio": 1})
    ch = client.channel(backend.target, [("grpc.service_config", config)])
    backend.script(UNARY, *[fail(grpc.StatusCode.NOT_FOUND)] * 3)
    for _ in range(3):
        assert ch.unary(UNARY, b"x", timeout=10).code == grpc.StatusCode.NOT_FOUND
    assert ch.throttle_tokens == 2.0


# -- serializers, stubs, interceptors --------------------------------------------------------------------


def test_serializers_run_once_per_message_whatever_the_attempts(client, backend):
    counts = {"ser": 0, "de": 0}

    def ser(text):
        counts["ser"] += 1
        return text.encode()

    def de(data):
        counts["de"] += 1
        return data.decode()

    backend.script(BIDI, fail(read=3, read_all=True), fail(read=3, read_all=True))
    ch = client.channel(backend.target, retry_options())
    out = ch.bidi(BIDI, ["a", "b", "c"], serializer=ser, deserializer=de, timeout=10)
    assert out.code == OK and out.responses == ["a", "b", "c"]
    assert counts == {"ser": 3, "de": 3}
    assert len(backend.attempts_of(BIDI)) == 3


def test_a_failing_serializer_fails_only_that_call(client, backend):
    def ser(value):
        if value == "boom":
            raise ValueError("cannot serialize")
        return value.encode()

    ch = client.channel(backend.target, retry_options())
    bad = ch.unary(UNARY, "boom", serializer=ser, timeout=10)
    assert bad.code == grpc.StatusCode.INTERNAL
    good = ch.unary(UNARY, "fine", serializer=ser, timeout=10)
    assert good.code == OK and good.response == b"fine"
    assert [a.requests for a in backend.attempts_of(UNARY)] == [[b"fine"]]


def test_a_failing_request_iterator_fails_that_call_as_grpcio_does(client, backend):
    def requests():
        yield b"one"
        raise RuntimeError("application bug")

    ch = client.channel(backend.target, retry_options())
    out = ch.client_stream(CLIENT_STREAM, requests(), timeout=10)
    if client.api == "sync":  # grpcio: UNKNOWN "Exception iterating requests!"
        assert (out.code, out.details) == (grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
    else:  # grpc.aio: the call is cancelled
        assert (out.code, out.details) == (grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
    # The server's stream is broken off (cancelled), not ended as if complete, as grpcio's own call's is (the
    # sync attempt: grpcio's blocking call on the caller's thread). It may be cancelled before the server saw it.
    attempts = backend.attempts_of(CLIENT_STREAM)
    assert len(attempts) <= 1
    for attempt in attempts:
        assert attempt.done.wait(5)
        assert attempt.cancelled and attempt.requests in ([], [b"one"])
    assert ch.unary(UNARY, b"after", timeout=10).code == OK


def test_generated_stubs_work_unchanged(client, backend):
    import echo_pb2

    # EchoRequest and EchoReply share their wire format, so the echoed bytes parse as a reply.
    echo = Step(respond=lambda requests, i: requests[0])
    backend.script(UNARY, fail(), echo)
    backend.script(SERVER_STREAM, fail(), echo)
    ch = client.channel(backend.target, retry_options())
    stub = ch.stub()
    request = echo_pb2.EchoRequest(text="hi", seq=7)
    reply = ch.invoke("unary", stub.Unary, request, timeout=10)
    assert reply.code == OK
    assert isinstance(reply.response, echo_pb2.EchoReply) and (reply.response.text, reply.response.seq) == ("hi", 7)
    stream = ch.invoke("server_stream", stub.ServerStream, request, timeout=10)
    assert stream.code == OK and [r.text for r in stream.responses] == ["hi"] * 3
    assert len(backend.attempts_of(UNARY)) == 2 and len(backend.attempts_of(SERVER_STREAM)) == 2


def test_interceptors_see_one_logical_call(client, backend):
    backend.script(UNARY, fail(), fail())
    interceptor = client.counting_interceptor()
    ch = client.channel(backend.target, retry_options(), interceptors=[interceptor])
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK
    # The method as each API gives it to its interceptors: str on grpc's sync channels, bytes on grpc.aio's.
    assert interceptor.calls == [UNARY if client.api == "sync" else UNARY.encode()]
    attempts = backend.attempts_of(UNARY)
    assert len(attempts) == 3
    assert all(a.metadata.get("x-intercepted") == "yes" for a in attempts)


def test_metadata_reaches_every_attempt(client, backend):
    backend.script(UNARY, fail())
    ch = client.channel(backend.target, retry_options())
    assert ch.unary(UNARY, b"x", timeout=10, metadata=(("x-user", "u1"),)).code == OK
    assert [a.metadata.get("x-user") for a in backend.attempts_of(UNARY)] == ["u1", "u1"]


# -- bad input at channel creation -----------------------------------------------------------------------


@pytest.mark.parametrize("options,fragment", [
    ([("grpc.service_config", '{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1}}]}')],
     "methodConfig[0].retryPolicy.maxAttempts"),
    ([("grpc.service_config", "{not json")], "JSON"),
    ([("grpc.per_rpc_retry_buffer_size", -1)], "grpc.per_rpc_retry_buffer_size"),
    ([("grpc.enable_retries", 2)], "grpc.enable_retries"),
    ([("grpc_retry.max_attempts", 0)], "grpc_retry.max_attempts"),
    ([("grpc.lb_policy_name", "random")], "grpc.lb_policy_name"),
])
def test_bad_options_raise_at_channel_creation(client, options, fragment):
    with pytest.raises(ValueError) as info:
        client.make_channel("127.0.0.1:1", options)
    assert fragment in str(info.value)
