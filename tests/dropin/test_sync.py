"""grpc's sync API, side by side: the same scenario through grpc.insecure_channel and through grpc_retry's."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

import grpc
import pytest
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, Step, fail
from support.deploy import free_port
from support.dropin import error_logs

import grpc_retry

HEADERS = (("h", "1"),)
TRAILERS = (("t", "2"),)


def status(error: grpc.RpcError) -> tuple:
    return (isinstance(error, grpc.Call), error.code(), error.details(),
            tuple(error.initial_metadata() or ()), tuple(error.trailing_metadata() or ()))


def outcome(fn) -> Any:
    try:
        return ("ok", fn())
    except grpc.RpcError as error:
        return ("error",) + status(error)
    except Exception as error:  # the exception type and words, as the application sees them
        return (type(error).__name__, str(error))


# -- results, statuses, metadata ----------------------------------------------------------------------------------


def unary_results(make, backend) -> Any:
    backend.script(UNARY, Step(headers=HEADERS, trailing=TRAILERS), fail(grpc.StatusCode.NOT_FOUND, "no such",
                                                                        trailing=TRAILERS))
    with make(backend.target) as channel:
        method = channel.unary_unary(UNARY)

        def with_call():
            response, call = method.with_call(b"a", metadata=(("k", "v"),), timeout=5)
            return response, call.code(), call.details(), tuple(call.initial_metadata()), \
                tuple(call.trailing_metadata())

        return outcome(with_call), outcome(lambda: method(b"b", timeout=5)), \
            [tuple(a.metadata.items()) for a in backend.attempts_of(UNARY)][:1]


def future_results(make, backend) -> Any:
    backend.script(UNARY, Step(), fail(grpc.StatusCode.PERMISSION_DENIED, "nope"))
    with make(backend.target) as channel:
        method = channel.unary_unary(UNARY)
        ok = method.future(b"a", timeout=5)
        seen = []
        ok.add_done_callback(lambda f: seen.append(("ok", f.done())))
        ok.result(timeout=5)
        failed = method.future(b"b", timeout=5)
        error = failed.exception(timeout=5)
        failed.add_done_callback(lambda f: seen.append(("failed", f.done())))
        return (ok.result(timeout=5), ok.done(), ok.running(), ok.cancelled(), ok.exception(), ok.traceback(),
                error.code(), error.details(), failed.traceback() is not None, failed.done(), sorted(seen),
                outcome(lambda: failed.result()))


def streams(make, backend) -> Any:
    backend.script(SERVER_STREAM, Step(headers=HEADERS, trailing=TRAILERS, responses=2))
    backend.script(CLIENT_STREAM, Step(trailing=TRAILERS))
    backend.script(BIDI, Step())
    with make(backend.target) as channel:
        stream = channel.unary_stream(SERVER_STREAM)(b"s", timeout=5)
        messages = list(stream)
        client = channel.stream_unary(CLIENT_STREAM)
        response, call = client.with_call(iter([b"1", b"2"]), timeout=5)
        future = client.future(iter([b"3"]), timeout=5)
        bidi = list(channel.stream_stream(BIDI)(iter([b"x", b"y"]), timeout=5))
        return (messages, stream.code(), stream.details(), tuple(stream.initial_metadata()),
                tuple(stream.trailing_metadata()), stream.done(), response, tuple(call.trailing_metadata()),
                future.result(timeout=5), bidi)


def with_call_with_a_deserializer(make, backend) -> Any:
    """The call with_call() gives answers as the call did: its result() is the deserialized response too."""
    backend.script(UNARY, Step(trailing=TRAILERS))
    with make(backend.target) as channel:
        seen = []
        for method, request in ((channel.unary_unary(UNARY, response_deserializer=lambda b: ("d", b)), b"u"),
                                (channel.stream_unary(CLIENT_STREAM, response_deserializer=lambda b: ("d", b)),
                                 iter([b"s", b"t"]))):
            response, call = method.with_call(request, timeout=5)
            seen.append((response, call.result(), call.result(timeout=1), call.exception(), call.done(),
                         call.running(), call.cancelled(), call.is_active(), call.time_remaining(), call.code(),
                         tuple(call.trailing_metadata())))
        return seen


_SEEN: Any = contextvars.ContextVar("seen", default="unset")


def request_iterators_start_in_a_fresh_context(make, backend) -> Any:
    """A request stream's iterator runs on another thread (grpcio: a new one each call; grpc_retry: a worker kept
    for the next): what one call's iterator sets in its context, the next one's does not see."""
    seen = []

    def requests(mark):
        seen.append(_SEEN.get())
        _SEEN.set(mark)
        yield b"r"

    with make(backend.target) as channel:
        method = channel.stream_unary(CLIENT_STREAM)
        responses = [method(requests(mark), timeout=5) for mark in ("first", "second", "third")]
        bidi = channel.stream_stream(BIDI)
        responses += [list(bidi(requests(mark), timeout=5)) for mark in ("fourth", "fifth")]
        return responses, seen, _SEEN.get()


def a_response_stream_is_sent_at_creation(make, backend) -> Any:
    with make(backend.target) as channel:
        stream = channel.unary_stream(SERVER_STREAM)(b"s", timeout=5)
        backend.wait_attempts(SERVER_STREAM, 1, timeout=5)  # nothing read yet
        return list(stream)


def a_request_iterator_that_is_not_iterable(make, backend) -> Any:
    with make(backend.target) as channel:
        return outcome(lambda: channel.stream_unary(CLIENT_STREAM)(5, timeout=5))[:3], \
            outcome(lambda: list(channel.stream_stream(BIDI)(5, timeout=5)))[:3]


def cancel_and_deadline(make, backend) -> Any:
    backend.script(UNARY, Step(wait=0), Step(wait=0))
    backend.script(SERVER_STREAM, Step(wait=0))
    with make(backend.target) as channel:
        future = channel.unary_unary(UNARY).future(b"c", timeout=30)
        backend.wait_attempts(UNARY, 1)
        cancelled = future.cancel()
        stream = channel.unary_stream(SERVER_STREAM)(b"d", timeout=0.2)
        return (cancelled, future.cancelled(), future.done(), outcome(lambda: future.result()),
                outcome(lambda: channel.unary_unary(UNARY)(b"e", timeout=0.2))[:3],
                outcome(lambda: list(stream))[:3], stream.code(), stream.details())


def time_remaining(make, backend) -> Any:
    backend.script(SERVER_STREAM, Step(wait=0.2))
    with make(backend.target) as channel:
        stream = channel.unary_stream(SERVER_STREAM)(b"t", timeout=10)
        remaining = stream.time_remaining()
        no_deadline = channel.unary_stream(SERVER_STREAM)(b"u")
        list(stream), list(no_deadline)
        return 9 < remaining <= 10, no_deadline.time_remaining()


def metadata_and_compression(make, backend) -> Any:
    with error_logs() as errors:
        return _metadata_and_compression(make, backend), errors


def _metadata_and_compression(make, backend) -> Any:
    with make(backend.target) as channel:
        method = channel.unary_unary(UNARY)
        return (outcome(lambda: method(b"z", metadata=(("Bad Key", "v"),), timeout=5))[:3],
                outcome(lambda: method(b"z", metadata=(("k-bin", "not bytes"),), timeout=5))[:2],
                outcome(lambda: method.future(b"z", metadata=(("k", 1),), timeout=5).result())[:2],
                outcome(lambda: method(b"z", compression=grpc.Compression.Gzip, timeout=5)),
                [outcome(lambda md=md: channel.stream_unary(CLIENT_STREAM)(iter([b"z"]), metadata=md, timeout=5))[:3]
                 for md in ((("Bad Key", "v"),), (("k-bin", "not bytes"),), (("k", 1),))],
                [outcome(lambda md=md: channel.stream_unary(CLIENT_STREAM).future(iter([b"z"]), metadata=md,
                                                                               timeout=5).result())[:3]
                 for md in ((("Bad Key", "v"),), (("k-bin", "not bytes"),), (("k", 1),))],
                outcome(lambda: channel.stream_unary(CLIENT_STREAM).future(
                    iter([b"z"]), compression=grpc.Compression.Gzip, timeout=5).result()))


@pytest.mark.parametrize("scenario", [unary_results, future_results, streams, with_call_with_a_deserializer,
                                      request_iterators_start_in_a_fresh_context, a_response_stream_is_sent_at_creation,
                                      a_request_iterator_that_is_not_iterable, cancel_and_deadline, time_remaining,
                                      metadata_and_compression], ids=lambda f: f.__name__)
def test_same_as_grpcio(same_as_grpcio, sync_channel, scenario):
    same_as_grpcio(scenario, sync_channel)


def test_the_hedging_policy_hedges_every_call(hedged_sync_channel):
    """The `+hedges` channel's calls above really hedge: each call, of every shape of the sync API, sends its hedge
    (which loses, on a server whose hedges lose: support/dropin.py), as the server and the channel's statistics
    count them."""
    backend = Backend(hedges_lose=True)
    try:
        with hedged_sync_channel(backend.target) as channel:
            unary = channel.unary_unary(UNARY)
            assert unary(b"a", timeout=10) == b"a"
            assert unary.with_call(b"b", timeout=10)[0] == b"b"
            assert unary.future(b"c", timeout=10).result() == b"c"
            assert list(channel.unary_stream(SERVER_STREAM)(b"d", timeout=10)) == [b"d#0", b"d#1", b"d#2"]
            assert channel.stream_unary(CLIENT_STREAM)(iter([b"e"]), timeout=10) == b"e"
            assert list(channel.stream_stream(BIDI)(iter([b"f"]), timeout=10)) == [b"f"]
            stats = channel.retry_stats()
            backend.wait_for(lambda: all(a.ended is not None for a in backend.attempts), what="the attempts' ends")
    finally:
        backend.stop()
    assert (backend.hedges, backend.unhedged) == (6, 0)
    assert [stats[method].hedges for method in (UNARY, SERVER_STREAM, CLIENT_STREAM, BIDI)] == [3, 1, 1, 1]
    assert [a.cancelled for a in backend.attempts if a.previous is not None] == [True] * 6  # each lost


# -- channels ------------------------------------------------------------------------------------------------------


def refused_options(make, backend) -> Any:
    return [outcome(lambda o=option: make(backend.target, options=[o]).close())
            for option in [(5, 0), ("grpc.primary_user_agent", ["x"]), ("grpc.primary_user_agent", "ok")]]


def connecting_new_channels(make, backend) -> Any:
    target = f"localhost:{backend.port}"  # resolved by name: the connect is asked for before it resolved
    ready = []
    for _ in range(5):
        with make(target) as channel:
            event = threading.Event()
            channel.subscribe(lambda state, e=event: state == grpc.ChannelConnectivity.READY and e.set(),
                              try_to_connect=True)
            ready.append(event.wait(5))
        with make(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=5)
            ready.append(True)
    return ready


def closing(make, backend) -> Any:
    backend.script(UNARY, Step(wait=0))
    channel = make(backend.target)
    future = channel.unary_unary(UNARY).future(b"held", timeout=30)
    backend.wait_attempts(UNARY, 1)
    started = time.monotonic()
    channel.close()
    took = time.monotonic() - started
    return (outcome(lambda: future.result(timeout=2))[:3], future.done(), took < 0.1,
            outcome(lambda: channel.unary_unary(UNARY)(b"late")))


def no_backend_takes_the_call(make, backend) -> Any:
    """A channel whose one address refuses connections: calls fail UNAVAILABLE in the words of the channel's LB
    policy (pick_first's, round_robin's) with the connection's error, the first (which tries to connect) and the
    next ones (which fail fast, the channel in TRANSIENT_FAILURE)."""
    port = free_port(["127.0.0.1"])  # nobody listens there
    seen = []
    for policy in ("pick_first", "round_robin"):
        with make(f"127.0.0.1:{port}", options=[("grpc.lb_policy_name", policy)]) as channel:
            for call in range(2):
                if call:
                    seen.append(_until_failing(channel))
                kind, is_call, code, details = outcome(lambda c=channel: c.unary_unary(UNARY)(b"x", timeout=5))[:4]
                seen.append((kind, is_call, code, details.replace(f":{port}:", ":PORT:")))
    return seen


def _until_failing(channel: Any) -> bool:
    """Until the channel reports TRANSIENT_FAILURE (within 5 s: False if not)."""
    failing = threading.Event()

    def seen(state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            failing.set()

    channel.subscribe(seen)
    try:
        return failing.wait(5)
    finally:
        channel.unsubscribe(seen)


@pytest.mark.parametrize("scenario", [refused_options, connecting_new_channels, closing, no_backend_takes_the_call],
                         ids=lambda f: f.__name__)
def test_channels_same_as_grpcio(same_as_grpcio, sync_channel, scenario):
    same_as_grpcio(scenario, sync_channel)


# -- the documented differences ------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, config", [
    ("ipv4:127.0.0.1", None),                                     # no port
    ("127.0.0.1:1", '{"methodConfig": [{"name": [{}], "timeout": "soon"}]}'),
])
def test_bad_targets_and_configs_raise_at_creation_where_grpcio_fails_each_call(target, config):
    """The one place grpc_retry differs on purpose: what grpcio reports on every call (after the call was made),
    grpc_retry reports where the channel is made, with the field and the reason (README: Differences)."""
    options = [] if config is None else [("grpc.service_config", config)]
    with grpc.insecure_channel(target, options=options) as theirs:
        with pytest.raises(grpc.RpcError):
            theirs.unary_unary(UNARY)(b"x", timeout=2)
    with pytest.raises(ValueError, match="target 'ipv4:127.0.0.1'|timeout: invalid duration 'soon'"):
        grpc_retry.insecure_channel(target, options=options)
