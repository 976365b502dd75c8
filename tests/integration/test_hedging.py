"""A6 hedging over three real grpcio backends on loopback, through both APIs (the `client` fixture).

The channel's target lists the three backends (pick_first, in order), so attempt i of a call goes to backend i
while the call has not used them all: each rule is checked on what each backend saw."""

import asyncio
import json
import threading
import time

import grpc
import pytest
from support.backend import BIDI, SERVER_END_LAG, SERVER_STREAM, UNARY, Step, fail, pushback
from support.clients import ECHO_SERVICE

import grpc_retry._method
import grpc_retry.aio
from grpc_retry import _transport as transport
from grpc_retry._timer import TIMERS

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def target(backends):
    return "ipv4:" + ",".join(b.target for b in backends)


def hedging_options(max_attempts=3, delay="0.2s", codes=("UNAVAILABLE",), throttling=None, extra=()):
    policy = {"maxAttempts": max_attempts, "nonFatalStatusCodes": list(codes)}
    if delay is not None:
        policy["hedgingDelay"] = delay
    config = {"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "hedgingPolicy": policy}]}
    if throttling:
        config["retryThrottling"] = throttling
    return [("grpc.service_config", json.dumps(config)), *extra]


def seen(backends, method=UNARY):
    return [len(b.attempts_of(method)) for b in backends]


def never_reached(backend, until, method=UNARY):
    """Whether no attempt reached `backend` before monotonic time `until` (past when a hedge would have come): a
    wait on the server's attempts, ended at once by one that comes."""
    try:
        backend.wait_attempts(method, 1, timeout=until - time.monotonic())
    except AssertionError:
        return True
    return False


def test_a_slow_first_attempt_is_hedged_on_another_backend(client, backends):
    backends[0].script(UNARY, Step(wait=0))  # never answers: held until cancelled
    ch = client.channel(target(backends), hedging_options(delay="0.2s"))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK and out.response == b"x"
    assert time.monotonic() - started >= 0.2
    assert seen(backends) == [1, 1, 0]
    assert backends[1].attempts_of(UNARY)[0].previous == "1"
    assert out.previous_attempts == "1"
    (slow,) = backends[0].wait_ended(UNARY, 1)
    assert slow.cancelled  # the loser was cancelled when the hedge won


def test_no_hedge_when_the_first_answers_in_time(client, backends):
    ch = client.channel(target(backends), hedging_options(delay="2s"))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK and out.previous_attempts is None
    assert seen(backends) == [1, 0, 0]


def test_zero_delay_sends_every_attempt_at_once(client, backends):
    for b in backends[:2]:
        b.script(UNARY, Step(wait=0))
    gate = threading.Event()
    backends[2].script(UNARY, Step(gate=gate))

    def release():  # backend 2 answers once the other two hold their attempts: all three went at once
        for b in backends[:2]:
            b.wait_attempts(UNARY, 1)
        gate.set()

    threading.Thread(target=release, daemon=True).start()
    ch = client.channel(target(backends), hedging_options(delay=None))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK
    assert seen(backends) == [1, 1, 1]
    assert [b.attempts_of(UNARY)[0].previous for b in backends] == [None, "1", "2"]
    assert out.previous_attempts == "2"


def test_a_non_fatal_status_sends_the_next_hedge_at_once(client, backends):
    backends[0].script(UNARY, fail(UNAVAILABLE))
    ch = client.channel(target(backends), hedging_options(delay="20s"))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=30)
    assert out.code == OK
    assert time.monotonic() - started < 5
    assert seen(backends) == [1, 1, 0]


def test_a_fatal_status_cancels_every_hedge_and_is_returned(client, backends):
    backends[0].script(UNARY, Step(wait=0))
    backends[1].script(UNARY, fail(grpc.StatusCode.INVALID_ARGUMENT, "bad request"))
    ch = client.channel(target(backends), hedging_options(delay="0.1s"))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=10)
    assert (out.code, out.details) == (grpc.StatusCode.INVALID_ARGUMENT, "bad request")
    assert out.previous_attempts == "1"
    (first,) = backends[0].wait_ended(UNARY, 1)
    assert first.cancelled
    assert never_reached(backends[2], started + 0.2 + 0.2)  # the third hedge, due at 0.2 s, never goes
    assert seen(backends) == [1, 1, 0]


# A hedged unary call's first attempt is one batch once the method's first calls showed that its server sends
# headers with its response (the core's HeadersWatch, made by _method): the tests below watch none (WATCH_FIRST = 0).


@pytest.fixture
def unwatched(monkeypatch):
    monkeypatch.setattr(grpc_retry._method, "WATCH_FIRST", 0)
    monkeypatch.setattr(grpc_retry._method, "WATCH_EVERY", 10**9)


@pytest.mark.parametrize("step, code, seen_after, previous", [
    (Step(), OK, [1, 0, 0], None),
    (fail(UNAVAILABLE), OK, [1, 1, 0], "1"),  # Trailers-Only, non-fatal: the next hedge goes at once
    (fail(UNAVAILABLE, headers=(("k", "v"),)), UNAVAILABLE, [1, 0, 0], None),  # headers committed it
    (fail(grpc.StatusCode.INVALID_ARGUMENT), grpc.StatusCode.INVALID_ARGUMENT, [1, 0, 0], None),
], ids=["ok", "trailers-only", "headers-then-failure", "fatal"])
def test_a_first_attempt_as_one_batch_decides_as_its_headers_would(client, backends, unwatched, step, code,
                                                                     seen_after, previous):
    backends[0].script(UNARY, step)
    ch = client.channel(target(backends), hedging_options(delay="5s"))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == code and out.previous_attempts == previous
    assert time.monotonic() - started < 4  # no wait for the hedging delay
    assert seen(backends) == seen_after
    assert ch.channel._state.watches[UNARY].calls == 1


def test_a_server_seen_sending_headers_ahead_has_every_first_attempt_show_them(client, backends, unwatched):
    """Backend 0 sends its headers 2 s ahead of its response. Unwatched, the call's first attempt is one batch: its
    headers do not stop the hedge, which goes to backend 1 at 0.2 s and commits the call with its own headers, sent
    0.3 s ahead. That shows the server sends them ahead: the next call's first attempt shows its headers first, and
    they commit it (no hedge)."""
    ahead = (("k", "v"),)
    backends[0].script(UNARY, Step(headers=ahead, headers_lead=2.0), Step(headers=ahead, headers_lead=2.0))
    backends[1].script(UNARY, Step(headers=ahead, headers_lead=0.3))
    ch = client.channel(target(backends), hedging_options(max_attempts=2, delay="0.2s"))
    first = ch.unary(UNARY, b"x", timeout=10)
    assert first.code == OK and first.previous_attempts == "1" and seen(backends) == [1, 1, 0]
    assert ch.channel._state.watches[UNARY].early
    started = time.monotonic()
    second = ch.unary(UNARY, b"x", timeout=10)
    assert second.code == OK and second.previous_attempts is None
    assert time.monotonic() - started >= 2.0  # backend 0's response: its headers committed the call
    assert seen(backends) == [2, 1, 0]


# Empty response headers may be a Trailers-Only response whose status is a moment behind: only silence after them
# (50 ms) commits the call to their attempt, as its response or real headers would.


def test_silence_after_empty_headers_commits_before_the_attempt_ends(client, backends):
    """Committed by its silence, the attempt's non-fatal status is the call's: no hedge follows it."""
    backends[0].script(UNARY, fail(UNAVAILABLE, "after silence", headers=(), headers_lead=0.3))
    ch = client.channel(target(backends), hedging_options(delay="5s"))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert (out.code, out.details) == (UNAVAILABLE, "after silence")
    assert seen(backends) == [1, 0, 0]


@pytest.mark.parametrize("delay", ["0.2s", "0.02s"])
def test_silence_after_empty_headers_stops_hedging(client, backends, delay):
    """The hedging delay ends after the silence has committed the call (0.2 s: no hedge), or before (0.02 s: the
    hedge goes, and is cancelled once the silence commits); either way the first attempt's answer is the call's."""
    backends[0].script(UNARY, Step(headers=(), headers_lead=0.4))
    backends[1].script(UNARY, Step(wait=0))  # a hedge here is held until cancelled
    ch = client.channel(target(backends), hedging_options(max_attempts=2, delay=delay))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK and out.previous_attempts is None
    hedges = ch.channel.retry_stats()[UNARY].hedges  # made, whether or not the server saw them
    if delay == "0.2s":
        assert seen(backends) == [1, 0, 0] and hedges == 0
    else:
        assert hedges == 1 and seen(backends)[::2] == [1, 0]
        (first,) = backends[0].wait_ended(UNARY, 1)  # (its end is recorded after its answer left)
        for hedge in backends[1].wait_all_ended(UNARY):  # (under load it may be cancelled on its way there)
            assert hedge.cancelled and hedge.ended < first.ended  # at the commit, not at the call's end


def test_when_every_hedge_fails_the_last_status_is_returned_after_the_last_ends(client, backends):
    for i, wait in enumerate((0.1, 0.6, 0.3)):
        backends[i].script(UNARY, fail(UNAVAILABLE, f"backend {i}", wait=wait))
    ch = client.channel(target(backends), hedging_options(delay=None))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert (out.code, out.details) == (UNAVAILABLE, "backend 1")
    assert out.previous_attempts == "1"
    assert seen(backends) == [1, 1, 1]


def test_pushback_stop_ends_hedging(client, backends):
    backends[0].script(UNARY, fail(UNAVAILABLE, "stop", trailing=(("grpc-retry-pushback-ms", "-1"),)))
    ch = client.channel(target(backends), hedging_options(delay="0.3s"))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=10)
    assert (out.code, out.details) == (UNAVAILABLE, "stop")
    assert never_reached(backends[1], started + 0.3 + 0.2)  # the next hedge, due at 0.3 s, never goes
    assert seen(backends) == [1, 0, 0]


def test_pushback_delays_the_next_hedge(client, backends):
    backends[0].script(UNARY, pushback(400))
    ch = client.channel(target(backends), hedging_options(delay="20s"))
    out = ch.unary(UNARY, b"x", timeout=30)
    assert out.code == OK
    (first,) = backends[0].attempts_of(UNARY)
    (second,) = backends[1].attempts_of(UNARY)
    assert 0.4 - SERVER_END_LAG <= second.arrived - first.ended < 5  # as test_retry's pushback test


def test_throttled_hedges_are_not_sent(client, backends):
    # maxTokens 2: a first call whose two attempts both fail takes the tokens to 0 (threshold 1). Each fails
    # only once both have arrived: had one failed before the other was sent, the throttle (1 token left) would
    # rightly hold the second back.
    both = threading.Event()

    def release():
        for b in backends[:2]:
            b.wait_attempts(UNARY, 1)
        both.set()

    threading.Thread(target=release, daemon=True).start()
    for b in backends[:2]:
        b.script(UNARY, fail(UNAVAILABLE, gate=both))
    options = hedging_options(max_attempts=2, delay=None, throttling={"maxTokens": 2, "tokenRatio": 0.1})
    ch = client.channel(target(backends), options)
    assert ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE
    assert ch.throttle_tokens == 0
    # Now only the original goes: the hedge due at once is throttled.
    backends[2].script(UNARY, Step(wait=0.3))
    before = sum(seen(backends))
    out = ch.unary(UNARY, b"x", timeout=10)
    assert out.code == OK
    assert sum(seen(backends)) - before == 1


def test_messages_go_to_every_live_hedge(client, backends):
    from support.clients import Gate

    # Backend 0 reads the whole request stream, then holds; the hedge (after 0.1 s) to backend 1 answers.
    backends[0].script(BIDI, Step(code=UNAVAILABLE, responses=0, read_all=True, wait=0))
    both = backends[1].event_when(lambda: len(backends[1].attempts_of(BIDI)) == 1)
    ch = client.channel(target(backends), hedging_options(delay="0.1s"))
    out = ch.bidi(BIDI, [b"a", Gate(both), b"b", b"c"], timeout=10)
    assert out.code == OK and out.responses == [b"a", b"b", b"c"]
    assert backends[1].attempts_of(BIDI)[0].requests == [b"a", b"b", b"c"]
    assert backends[1].attempts_of(BIDI)[0].previous == "1"


def test_a_server_stream_commits_to_the_first_hedge_with_a_message(client, backends):
    backends[0].script(SERVER_STREAM, Step(wait=0))
    ch = client.channel(target(backends), hedging_options(delay="0.1s"))
    out = ch.server_stream(SERVER_STREAM, b"s", timeout=10)
    assert out.code == OK and out.responses == [b"s#0", b"s#1", b"s#2"]
    assert out.previous_attempts == "1"
    assert seen(backends, SERVER_STREAM) == [1, 1, 0]


def test_a_message_read_ahead_is_delivered_after_the_winner_ended(backends):
    # A hedged response stream commits on its first message, which grpc_retry reads ahead; with one message the
    # winner then ends at once. Read only after the call has ended, that message is still the application's.
    backends[0].script(SERVER_STREAM, Step(responses=1))

    async def run():
        async with grpc_retry.aio.insecure_channel(target(backends), options=hedging_options(delay="5s")) as ch:
            call = ch.unary_stream(SERVER_STREAM)(b"s", timeout=10)
            ended = asyncio.Event()
            call.add_done_callback(lambda _: ended.set())
            await asyncio.wait_for(ended.wait(), 5)
            return [m async for m in call], await call.code()

    assert asyncio.run(run()) == ([b"s#0"], OK)


def test_deadline_during_hedging_ends_the_call_and_every_attempt(client, backends):
    for b in backends:
        b.script(UNARY, Step(wait=0))
    ch = client.channel(target(backends), hedging_options(delay="0.1s"))
    out = ch.unary(UNARY, b"x", timeout=0.6)
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED
    for b in backends:
        b.wait_ended(UNARY, 1)
    assert seen(backends) == [1, 1, 1]


def test_cancel_during_hedging_cancels_every_attempt(client, backends):
    for b in backends:
        b.script(UNARY, Step(wait=0))
    ch = client.channel(target(backends), hedging_options(delay=None))
    handle = ch.start_call("unary", UNARY, b"x", timeout=30)
    for b in backends:
        b.wait_attempts(UNARY, 1)
    assert handle.cancel()
    out = handle.result(10)
    assert out.code == grpc.StatusCode.CANCELLED
    for b in backends:
        (attempt,) = b.wait_ended(UNARY, 1)
        assert attempt.cancelled
    assert handle.done_callbacks == [1]


def test_hedging_off_with_enable_retries_0(client, backends):
    backends[0].script(UNARY, Step(wait=0.5))
    ch = client.channel(target(backends), hedging_options(delay=None, extra=[("grpc.enable_retries", 0)]))
    assert ch.unary(UNARY, b"x", timeout=10).code == OK
    assert seen(backends) == [1, 0, 0]


def test_buffer_overflow_commits_to_a_hedge_and_cancels_the_others(client, backends):
    from support.clients import Gate

    # Both hedges are live when the third message overflows the 10-byte buffer, and neither has answered (each
    # backend holds its attempt 1 s, then echoes). The call commits to the hedge that has sent the most (which
    # one depends on thread timing on the sync API), cancels the other, and goes on to the winner's answer.
    for b in backends[:2]:
        b.script(BIDI, Step(wait=1.0))
    hedge_live = backends[1].event_when(lambda: len(backends[1].attempts_of(BIDI)) == 1)
    ch = client.channel(target(backends), hedging_options(delay="0.1s",
                                                          extra=[("grpc.per_rpc_retry_buffer_size", 10)]))
    out = ch.bidi(BIDI, [b"aaaa", Gate(hedge_live), b"bbbb", b"cccc"], timeout=10)
    assert out.code == OK and out.responses == [b"aaaa", b"bbbb", b"cccc"]
    attempts = [b.wait_ended(BIDI, 1)[0] for b in backends[:2]]
    assert sorted(a.cancelled for a in attempts) == [False, True]
    winner = 0 if not attempts[0].cancelled else 1
    assert attempts[winner].requests == [b"aaaa", b"bbbb", b"cccc"]
    assert out.previous_attempts == (None if winner == 0 else "1")
    assert seen(backends, BIDI) == [1, 1, 0]
    assert ch.state.pool.used == 0
    if client.api == "sync":  # no timer outlives the call (a 0 s wake-up may still be on its way)
        deadline = time.monotonic() + 5
        while TIMERS.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert TIMERS.pending() == 0


@pytest.mark.parametrize("wait_for_ready", [None, True])
def test_hedged_call_with_no_backend_up(client, wait_for_ready):
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as sock:  # a loopback port nothing listens on
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    ch = client.channel("ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports), hedging_options(delay="0.05s"))
    started = time.monotonic()
    out = ch.unary(UNARY, b"x", timeout=1.0, wait_for_ready=wait_for_ready)
    if wait_for_ready:
        assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED  # waited for a backend until the deadline
        assert time.monotonic() - started >= 0.9
    else:
        assert out.code == UNAVAILABLE  # failed fast, as grpcio does


def test_a_blocking_hedged_call_waits_on_its_own_attempt(backends, monkeypatch):
    # The caller of a blocking hedged call polls its first attempt on that attempt's own queue, as grpcio's
    # blocking call does: no thread is started per call (grpcio's spin thread, started and ended for each call
    # that does not overlap another, cost ~3x a unary call). Overlapping calls share grpcio's spin thread; both
    # shapes give the same results, and a polled attempt that loses to a hedge is cancelled and polled to its end.
    # (The portable transport's attempt is grpcio's unary-stream call, which starts grpcio's spin thread when it
    # overlaps no other call: there, only the results and the loser's cancel are the same.)
    started = []
    start = threading.Thread.start

    caller = threading.current_thread()

    def counting_start(thread):  # threads the caller starts (the in-process servers start their own)
        if thread.name != "grpc_retry-timers" and threading.current_thread() is caller:
            started.append(thread.name)
        start(thread)

    with grpc_retry.insecure_channel(target(backends), options=hedging_options(delay="1s")) as ch:
        unary = ch.unary_unary(UNARY)
        assert unary(b"warm", timeout=10) == b"warm"
        monkeypatch.setattr(threading.Thread, "start", counting_start)
        for i in range(20):
            response, call = unary.with_call(b"%d" % i, timeout=10)
            assert response == b"%d" % i and call.code() == OK
        if transport.NAME == "direct":
            assert started == []
        monkeypatch.setattr(threading.Thread, "start", start)

        results = []
        threads = [threading.Thread(target=lambda i=i: results.append(unary(b"%d" % i, timeout=10)))
                   for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(results) == sorted(b"%d" % i for i in range(8))

    before = len(backends[0].attempts_of(UNARY))
    backends[0].script(UNARY, Step(wait=0))  # the polled first attempt never answers: the hedge wins
    with grpc_retry.insecure_channel(target(backends), options=hedging_options(delay="0.1s")) as ch:
        assert ch.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert backends[0].wait_ended(UNARY, before + 1)[-1].cancelled


@pytest.mark.parametrize("with_call", [False, True])
def test_a_blocking_hedged_call_goes_on_when_it_needs_more_than_one_attempt(backends, with_call):
    # A blocking hedged call's caller polls its first attempt, and the call goes on, on the same driver, when a
    # hedge is due: with its first attempt still out (the hedging timer; the hedge reports from grpcio's thread),
    # ended with a Trailers-Only failure and the next hedge delayed by pushback (its empty headers must not be
    # judged again later), or ended with a non-fatal status (the next hedge at once, made by the caller). Each ends
    # with the hedge's answer.

    def call(ch, request):
        unary = ch.unary_unary(UNARY)
        if not with_call:
            return unary(request, timeout=10)
        response, grpc_call = unary.with_call(request, timeout=10)
        assert grpc_call.code() == OK and grpc_call.done() and grpc_call.result() == response
        assert grpc_call.time_remaining() is None and not grpc_call.is_active()  # as grpcio's with_call's call
        return response

    for step, delay in ((Step(wait=0), "0.1s"), (pushback(100), "20s"), (fail(UNAVAILABLE), "20s")):
        backends[0].script(UNARY, step)
        ch = grpc_retry.insecure_channel(target(backends), options=hedging_options(delay=delay))
        results: list = []
        caller = threading.Thread(target=lambda r=results, c=ch: r.append(call(c, b"x")), daemon=True)
        caller.start()
        caller.join(5)  # (a call that never ends fails here, not at its deadline's mercy)
        ch.close()
        assert results == [b"x"]
        assert backends[1].attempts_of(UNARY)[-1].previous == "1"


def test_an_interrupted_blocking_hedged_call_leaves_nothing_behind(backends, monkeypatch):
    # A signal's exception in the caller, while it polls its attempt (grpcio checks for signals as it waits):
    # the exception goes on, the call and its attempt are cancelled, and the next call polls again. (On the
    # portable transport, whose caller waits on its call, the same holds but the polling.)
    import signal

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()

    backends[0].script(UNARY, Step(wait=0))  # never answers: held until cancelled
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with grpc_retry.insecure_channel(target(backends), options=hedging_options(delay="5s")) as ch:
            unary = ch.unary_unary(UNARY)
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            started = time.monotonic()
            with pytest.raises(Interrupted):
                unary(b"x", timeout=20)
            assert time.monotonic() - started < 5  # not the hedge's answer
            (held,) = backends[0].wait_ended(UNARY, 1)
            assert held.cancelled
            spawned = []  # threads the caller starts (the in-process servers start their own)
            caller = threading.current_thread()
            start = threading.Thread.start
            monkeypatch.setattr(threading.Thread, "start",
                                lambda thread: (spawned.append(thread.name)
                                                if threading.current_thread() is caller else None,
                                                start(thread))[1])
            assert unary(b"y", timeout=10) == b"y"  # polled, as before: no thread started
            if transport.NAME == "direct":  # (the portable one's attempt may start grpcio's spin thread)
                assert [name for name in spawned if name != "grpc_retry-timers"] == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_overlapping_blocking_callers_each_keep_their_hedging_delay(backends):
    # Overlapping blocking hedged calls: each polls its own first attempt, and the timer thread keeps each one's
    # hedging delay (in the method's lane). Each hedges on time, to another backend, and leaves no timer behind.
    with grpc_retry.insecure_channel(target(backends), options=hedging_options(delay="0.5s")) as ch:
        unary = ch.unary_unary(UNARY)
        assert unary(b"warm", timeout=10) == b"warm"
        before = len(backends[0].attempts_of(UNARY))
        backends[0].script(UNARY, *[Step(wait=10)] * 4)  # the first attempts hold: the hedges win
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.update({i: unary(b"%d" % i, timeout=10)}))
                   for i in range(4)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        backends[0].wait_attempts(UNARY, before + 4)
        for thread in threads:
            thread.join(10)
        assert results == {i: b"%d" % i for i in range(4)}
        assert time.monotonic() - started >= 0.5
        assert TIMERS.pending() == 0
    assert all(attempt.cancelled for attempt in backends[0].wait_ended(UNARY, before + 4)[before:])
