"""A blocking stream-unary call (`__call__`, `with_call`) on the sync channel: its caller's thread runs each
attempt as grpcio's blocking call; a worker thread of the channel's sends the attempt's requests, pulling the
application's messages (stream-stream attempts' requests too). What only this shape has to get right: the caller
woken when that other thread ends the call, the channel's close during backoff, an interrupt, an iterator that
fails while a retry is due, and the threads kept from call to call."""

import json
import signal
import threading
import time

import grpc
import pytest
from support.backend import BIDI, CLIENT_STREAM, Step, fail
from support.clients import ECHO_SERVICE, retry_options, retry_policy

import grpc_retry

SLOW_RETRY = retry_policy(max_attempts=3, initial="20s", maximum="20s")  # a retry that never comes in a test


def _requests(first: bytes, asked: threading.Event, gate: threading.Event, then: bytes):
    yield first
    asked.set()  # the attempt's sender asks for the next message: the attempt may fail now
    gate.wait(10)
    yield then


def _in_backoff(channel) -> threading.Event:
    """An event set once a call of the channel waits out its backoff (no event of grpc_retry's says so)."""
    event = threading.Event()

    def watch():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(call._machine.state_name == "BACKOFF" for call in list(channel._state.calls)):
                break
            time.sleep(0.005)
        event.set()

    threading.Thread(target=watch, daemon=True).start()
    return event


def test_an_overflow_while_in_backoff_ends_the_call_with_the_last_status_at_once(backend):
    # The first attempt fails after one message; the application's next message comes while the call waits out
    # its backoff (20 s), and overflows the buffer: no attempt may follow, and the call ends then. The server fails
    # the attempt only once the client has asked for that message (else no one asks for it before the next attempt).
    asked = threading.Event()
    backend.script(CLIENT_STREAM, fail(details="first", read=1, gate=asked))
    options = retry_options(SLOW_RETRY, options=[("grpc.per_rpc_retry_buffer_size", 16)])
    with grpc_retry.insecure_channel(backend.target, options=options) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            requests = _requests(b"a", asked, _in_backoff(channel), b"b" * 64)
            channel.stream_unary(CLIENT_STREAM)(requests, timeout=30)
        assert time.monotonic() - started < 5
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and raised.value.details() == "first"
    assert len(backend.attempts_of(CLIENT_STREAM)) == 1


def test_a_failing_iterator_while_in_backoff_ends_the_call_at_once(backend):
    asked = threading.Event()
    backend.script(CLIENT_STREAM, fail(read=1, gate=asked))

    def requests(in_backoff):
        yield b"a"
        asked.set()
        in_backoff.wait(10)
        raise RuntimeError("the application's iterator fails")

    with grpc_retry.insecure_channel(backend.target, options=retry_options(SLOW_RETRY)) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            channel.stream_unary(CLIENT_STREAM).with_call(requests(_in_backoff(channel)), timeout=30)
        assert time.monotonic() - started < 5
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    assert raised.value.details() == "Exception iterating requests!"  # grpcio's words
    assert len(backend.attempts_of(CLIENT_STREAM)) == 1


def test_the_channels_close_ends_a_call_in_backoff(backend):
    backend.script(CLIENT_STREAM, fail())
    channel = grpc_retry.insecure_channel(backend.target, options=retry_options(SLOW_RETRY))
    box: dict = {}

    def call():
        try:
            channel.stream_unary(CLIENT_STREAM)(iter([b"a", b"b"]), timeout=30)
        except grpc.RpcError as error:
            box["error"] = error

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert _in_backoff(channel).wait(10)
    channel.close()
    caller.join(5)
    assert not caller.is_alive(), "the call waited out its backoff after the channel closed"
    assert box["error"].code() == grpc.StatusCode.CANCELLED and box["error"].details() == "Channel closed!"


def test_an_interrupted_call_cancels_its_attempt_and_the_next_call_works(backend):
    # A signal's exception in the caller while it waits for the attempt (grpcio checks for signals as it waits).
    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()

    backend.script(CLIENT_STREAM, Step(wait=0))  # held until cancelled
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with grpc_retry.insecure_channel(backend.target, options=retry_options()) as channel:
            method = channel.stream_unary(CLIENT_STREAM)
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                method(iter([b"a", b"b"]), timeout=20)
            (held,) = backend.wait_ended(CLIENT_STREAM, 1, timeout=5)
            assert held.cancelled
            assert method(iter([b"c", b"d"]), timeout=10) == b"c|d"
            assert len(channel._state.calls) == 0  # nothing of the interrupted call stays with the channel
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", ["stream_unary", "stream_unary_future", "stream_unary_hedged", "stream_stream"])
def test_calls_one_after_another_reuse_the_threads_sending_their_requests(backend, monkeypatch, kind):
    # grpcio starts a thread per call with a request stream to send its requests; grpc_retry keeps its worker for
    # the next call (a call may start one while the last call's worker is still on its way back to idle).
    options = retry_options()
    if kind == "stream_unary_hedged":
        options = [("grpc.service_config", json.dumps({"methodConfig": [{
            "name": [{"service": ECHO_SERVICE}],
            "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "10s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}))]
    with grpc_retry.insecure_channel(backend.target, options=options) as channel:
        if kind == "stream_unary":
            method = channel.stream_unary(CLIENT_STREAM)
        elif kind != "stream_stream":  # a non-blocking call (the hedged blocking one runs as one)
            future = channel.stream_unary(CLIENT_STREAM).future

            def method(requests, timeout):
                return future(requests, timeout=timeout).result()
        else:
            bidi = channel.stream_stream(BIDI)

            def method(requests, timeout):
                return b"|".join(bidi(requests, timeout=timeout))
        assert method(iter([b"w"]), timeout=10) == b"w"
        started = []
        start = threading.Thread.start
        monkeypatch.setattr(threading.Thread, "start", lambda thread: (started.append(thread), start(thread))[1])
        for i in range(40):
            assert method(iter([b"a", str(i).encode()]), timeout=10) == b"a|" + str(i).encode()
        monkeypatch.undo()
        # Threads but the workers: grpcio's spin thread (it takes the events of non-blocking calls, and starts and
        # ends with each call that overlaps no other) and the timers' thread (hedging); none sending requests —
        # with grpcio's thread for those, that would be two a call.
        others = [t.name for t in started if t.name != "grpc_retry-worker"]
        assert len(others) <= 40 + 3, f"{len(others)} other threads started for 40 calls"
        workers_started = [t for t in started if t.name == "grpc_retry-worker"]
        assert len(workers_started) <= 10, f"{len(workers_started)} workers started for 40 calls"
        workers = [t for t in threading.enumerate() if t.name == "grpc_retry-worker"]
        assert workers, "no worker of the channel's sent the requests"
    deadline = time.monotonic() + 5
    for worker in workers:  # idle workers end with their channel
        worker.join(max(0.0, deadline - time.monotonic()))
    assert not any(worker.is_alive() for worker in workers)
