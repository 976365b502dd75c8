"""Calls made on an `xds:` channel before its first config: each waits for it as any call waits for its route,
and ends at its deadline, when the channel closes or when it is cancelled; a call whose start raises as the config
comes ends once and alone. A channel without a bootstrap raises as it is made."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, List, Tuple

import grpc
import pytest

pytest.importorskip("envoy")

from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend  # noqa: E402
from support.control_plane import LISTENER, ControlPlane  # noqa: E402
from support.xds_resources import listener  # noqa: E402
from support.xds_scenario import serve  # noqa: E402

import grpc_retry  # noqa: E402
import grpc_retry.aio  # noqa: E402


@pytest.mark.parametrize("make", [grpc_retry.insecure_channel, grpc_retry.aio.insecure_channel])
def test_a_missing_bootstrap_raises_at_creation(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP", raising=False)
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP_CONFIG", raising=False)
    with pytest.raises(ValueError, match="GRPC_XDS_BOOTSTRAP"):
        make("xds:///svc")


@pytest.mark.parametrize("kind, method, payload", [
    ("unary", UNARY, b"x"), ("server_stream", SERVER_STREAM, b"x"), ("client_stream", CLIENT_STREAM, [b"a", b"b"]),
    ("bidi", BIDI, [b"a", b"b"])])
def test_a_call_made_before_the_first_config_waits_for_it(client: Any, plane: ControlPlane, backends: List[Backend],
                                                          kind: str, method: str, payload: Any) -> None:
    channel = client.channel("xds:///svc")  # (the control plane has no route config yet)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(channel.invoke, kind, channel.multicallable(kind, method), payload, timeout=10)
        plane.wait_for(lambda: plane.streams() == 1, what="the channel's ADS stream")
        assert not pending.done(), pending.exception()
        serve(plane, {"c1": backends[:1]})
        assert pending.result(10).code == grpc.StatusCode.OK
    assert len(backends[0].attempts_of(method)) == 1
    # The call's place in its cluster's circuit breaker is given back when it ends (no event tells: polled).
    breakers = [entry.admission.breaker for entry in channel.raw._router._clusters.values()]
    deadline = time.monotonic() + 5
    while any(breaker.inflight for breaker in breakers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [breaker.inflight for breaker in breakers] == [0]


def test_a_config_that_never_comes_ends_the_call_at_its_deadline(client: Any, plane: ControlPlane) -> None:
    outcome = client.channel("xds:///svc").unary(UNARY, b"x", timeout=0.3)
    assert outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_call_waiting_for_the_first_config_ends_when_the_channel_closes(client: Any, plane: ControlPlane) -> None:
    channel = client.channel("xds:///svc")  # (no route config: no config comes)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(channel.unary, UNARY, b"x")  # no deadline
        router = channel.raw._router
        deadline = time.monotonic() + 10  # (no event tells that the call waits: polled)
        while not (router._waiters or router._ready._waiters) and time.monotonic() < deadline:
            time.sleep(0.01)
        channel.close()
        outcome = pending.result(10)
    assert (outcome.code, outcome.details) == (grpc.StatusCode.CANCELLED, "Channel closed!")


def test_an_asyncio_call_waiting_for_the_first_config_can_be_cancelled(plane: ControlPlane) -> None:
    async def run() -> Any:
        async with grpc_retry.aio.insecure_channel("xds:///svc") as channel:  # (no route config comes)
            call = channel.unary_unary(UNARY)(b"x")
            assert not call.done() and call.cancel() and call.cancelled()
            with pytest.raises(asyncio.CancelledError):
                await call
            return await call.code(), await call.details()
    assert asyncio.run(asyncio.wait_for(run(), 10)) == (grpc.StatusCode.CANCELLED,
                                                        "Locally cancelled by application!")


def test_a_call_waiting_for_ready_waits_through_the_errors_before_a_config(client: Any, plane: ControlPlane,
                                                                          backends: List[Backend]) -> None:
    """The Listener is deleted before any config: a call fails UNAVAILABLE with that error, one that waits for
    ready waits for the config that comes next, as on grpcio."""
    channel = client.channel("xds:///svc")
    plane.wait_answer("channels", LISTENER, 1)  # (held: removed, it is deleted, not merely never sent)
    plane.wait_answer("channels", LISTENER, plane.remove(LISTENER, "svc"))
    outcome = channel.unary(UNARY, b"x", timeout=10)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE and "does not exist" in (outcome.details or "")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(channel.unary, UNARY, b"x", timeout=10, wait_for_ready=True)
        router = channel.raw._router
        deadline = time.monotonic() + 10  # (no event tells that the call waits: polled)
        while not (router._waiters or router._ready._waiters) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not waiting.done()
        plane.set(listener())
        serve(plane, {"c1": backends[:1]})
        assert waiting.result(10).code == grpc.StatusCode.OK


def test_a_sync_future_or_stream_made_before_the_first_config_is_returned_at_once(
        plane: ControlPlane, backends: List[Backend]) -> None:
    with grpc_retry.insecure_channel("xds:///svc") as channel:  # (no route config yet)
        future = channel.unary_unary(UNARY).future(b"x", timeout=10)
        stream = channel.unary_stream(SERVER_STREAM)(b"x", timeout=10)
        cancelled = channel.unary_unary(UNARY).future(b"x", timeout=10)
        late = channel.unary_unary(UNARY).future(b"x", timeout=0.2)
        told = threading.Event()
        future.add_done_callback(lambda _: told.set())
        assert not future.done() and future.running() and stream.is_active()
        assert cancelled.cancel() and cancelled.cancelled() and cancelled.code() == grpc.StatusCode.CANCELLED
        with pytest.raises(grpc.RpcError) as ended:
            late.result()
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        serve(plane, {"c1": backends[:1]})
        assert future.result(10) == b"x" and told.wait(10)
        assert list(stream) == [b"x#0", b"x#1", b"x#2"] and stream.code() == grpc.StatusCode.OK
    assert len(backends[0].attempts) == 2


_AIO_FACTORIES = {"unary": "unary_unary", "server_stream": "unary_stream", "client_stream": "stream_unary",
                  "bidi": "stream_stream"}


_AIO_METHODS = {"unary": UNARY, "server_stream": SERVER_STREAM, "client_stream": CLIENT_STREAM, "bidi": BIDI}


async def _raised_at_the_call_site(channel: Any, kind: str, credentials: grpc.CallCredentials) -> Any:
    """What making a call of `kind` with call `credentials` raised (the call made none, as grpcio's): its type and
    words."""
    method = getattr(channel, _AIO_FACTORIES[kind])(_AIO_METHODS[kind])
    with pytest.raises(Exception) as raised:
        method(b"x" if kind in ("unary", "server_stream") else iter([b"x"]), timeout=3, credentials=credentials)
    return type(raised.value), str(raised.value)


@pytest.mark.parametrize("kind", list(_AIO_FACTORIES))
def test_an_asyncio_call_with_call_credentials_on_an_insecure_channel_raises_as_on_grpcio(
        plane: ControlPlane, backends: List[Backend], kind: str) -> None:
    """grpcio raises at the call site, before its xDS client has a config as after (it checks the channel's
    credentials): so does grpc_retry, rather than leave a call made before the config that never ends."""
    credentials = [grpc.access_token_call_credentials("t"),
                   grpc.metadata_call_credentials(lambda context, callback: callback((), None))]

    async def run() -> Tuple[List[Any], List[Any], List[Any]]:
        async with grpc.aio.insecure_channel(backends[0].target) as channel:
            expected = [await _raised_at_the_call_site(channel, kind, each) for each in credentials]
        async with grpc_retry.aio.insecure_channel("xds:///svc") as channel:  # (no route config yet)
            before = [await _raised_at_the_call_site(channel, kind, each) for each in credentials]
            serve(plane, {"c1": backends[:1]})
            assert await channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"  # (the config has come)
            after = [await _raised_at_the_call_site(channel, kind, each) for each in credentials]
        return expected, before, after
    expected, before, after = asyncio.run(asyncio.wait_for(run(), 20))
    assert before == after == expected and expected[0][0] is grpc.aio.UsageError, (before, after, expected)
    assert [attempt.requests for attempt in backends[0].attempts] == [[b"x"]]


def test_an_asyncio_call_whose_start_raises_when_the_first_config_comes_ends_once(
        plane: ControlPlane, backends: List[Backend]) -> None:
    """A call made before the first config whose start then raises (metadata that is no sequence of pairs, which
    a route cannot read): it ends INTERNAL, telling its done callbacks once, and the call made after it starts."""
    async def run() -> Tuple[Any, ...]:
        async with grpc_retry.aio.insecure_channel("xds:///svc") as channel:  # (no route config yet)
            told: List[Any] = []
            broken = channel.unary_unary(UNARY)(b"x", timeout=10, metadata={"key": "value"})
            broken.add_done_callback(told.append)
            fine = channel.unary_unary(UNARY)(b"y", timeout=10)
            serve(plane, {"c1": backends[:1]})
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await broken
            return (ended.value.code(), await broken.code(), broken.done(), told == [broken], await fine,
                    await broken.details())
    *outcome, details = asyncio.run(asyncio.wait_for(run(), 20))
    assert outcome == [grpc.StatusCode.INTERNAL, grpc.StatusCode.INTERNAL, True, True, b"y"]
    assert "could not start" in details and "ValueError" in details, details
    assert [a.requests for a in backends[0].attempts] == [[b"y"]]


def test_a_sync_call_whose_start_raises_when_the_first_config_comes_ends_alone(
        plane: ControlPlane, backends: List[Backend]) -> None:
    """Calls made before the first config: the first one's start raises (its request serializer fails, which
    grpcio raises at the call site); that call ends with grpcio's status and words, and those after it start."""
    def failing(request: bytes) -> bytes:
        raise RuntimeError("no bytes for this request")
    with grpc.insecure_channel(backends[0].target) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_stream(SERVER_STREAM, request_serializer=failing)(b"x", timeout=10)
    expected = (raised.value.code(), raised.value.details())
    with grpc_retry.insecure_channel("xds:///svc") as channel:  # (no route config yet)
        broken = channel.unary_stream(SERVER_STREAM, request_serializer=failing)(b"x", timeout=10)
        future = channel.unary_unary(UNARY).future(b"y", timeout=10)
        stream = channel.unary_stream(SERVER_STREAM)(b"z", timeout=10)
        serve(plane, {"c1": backends[:1]})
        assert future.result(5) == b"y"
        assert list(stream) == [b"z#0", b"z#1", b"z#2"]
        with pytest.raises(grpc.RpcError) as ended:
            next(broken)
        assert (ended.value.code(), ended.value.details()) == expected == (broken.code(), broken.details())
        assert not broken.is_active() and broken.done()


def test_a_sync_call_whose_start_raises_when_the_first_config_comes_leaves_the_update_whole(
        plane: ControlPlane, backends: List[Backend]) -> None:
    """The rest of the update is applied after the waiting calls start: the connection asked for before the
    config (subscribe's try_to_connect) is made, with no call to make it."""
    def failing(request: bytes) -> bytes:
        raise RuntimeError("no bytes for this request")
    ready = threading.Event()

    def told(state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.READY:
            ready.set()
    with grpc_retry.insecure_channel("xds:///svc") as channel:  # (no route config yet)
        broken = channel.unary_stream(SERVER_STREAM, request_serializer=failing)(b"x", timeout=10)
        channel.subscribe(told, try_to_connect=True)
        serve(plane, {"c1": backends[:1]})
        assert ready.wait(5)
        with pytest.raises(grpc.RpcError):
            next(broken)
    assert backends[0].attempts == []
