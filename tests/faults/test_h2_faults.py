"""Transparent retries against a real HTTP/2 peer (tests/support/h2_fault.py) that refuses streams, sends GOAWAY
or resets streams, next to a healthy grpcio backend in one `ipv4:` target. No retry policy is configured unless a
test says so: what succeeds here succeeds transparently."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, fail
from support.clients import ECHO_SERVICE, retry_policy, service_config
from support.h2_fault import GOAWAY, NO_STREAMS, REFUSE, RESET, UNKNOWN_CODE, H2FaultServer

OK = grpc.StatusCode.OK
PREVIOUS = "grpc-previous-rpc-attempts"


@pytest.fixture
def fault(request):
    server = H2FaultServer(request.param)
    yield server
    server.stop()


def ipv4(*servers) -> str:
    return "ipv4:" + ",".join(server.target for server in servers)


METHODS = {"unary": UNARY, "server_stream": SERVER_STREAM, "client_stream": CLIENT_STREAM, "bidi": BIDI}
# A request stream is replayable only while the call keeps it, i.e. under a retry policy (a call without one
# commits at once and keeps nothing). This one never retries UNAVAILABLE: a success can only be transparent.
HEDGING = {"maxAttempts": 2, "hedgingDelay": "0.2s"}
ABORTED_ONLY = [("grpc.service_config", service_config(retry_policy(max_attempts=2, codes=("ABORTED",))))]


def call(ch, kind: str, n: int = 0, **kw):
    payload = [b"a", b"b"] if kind in ("client_stream", "bidi") else b"x"
    return getattr(ch, kind)(METHODS[kind], payload, timeout=10, metadata=(("x-call-id", str(n)),), **kw)


@pytest.mark.parametrize("fault", [REFUSE, GOAWAY], indirect=True)
@pytest.mark.parametrize("kind", ["unary", "server_stream", "client_stream", "bidi"])
def test_refused_and_goaway_streams_are_retried_elsewhere(client, backend, fault, kind):
    options = ABORTED_ONLY if kind in ("client_stream", "bidi") else None
    ch = client.channel(ipv4(fault, backend), options)  # pick_first: calls try the fault server first
    outcomes = [call(ch, kind, n) for n in range(3)]
    assert [o.code for o in outcomes] == [OK] * 3, outcomes
    assert all(o.responses and PREVIOUS not in o.trailing for o in outcomes)
    # The first call meets the fault first (pick_first, in order). Later ones usually do too, but pick_first
    # prefers a READY backend to a fault server that is IDLE (after GOAWAY) or still reconnecting (under load).
    assert 1 <= fault.streams_seen <= 3
    served = backend.attempts_of(METHODS[kind])
    assert sorted(a.metadata["x-call-id"] for a in served) == ["0", "1", "2"]
    assert all(a.previous is None for a in served)  # a transparent retry is not a counted attempt


@pytest.mark.parametrize("fault", [RESET], indirect=True)
@pytest.mark.parametrize("kind", ["unary", "server_stream"])
def test_internal_error_reset_is_not_transparent(client, backend, fault, kind):
    ch = client.channel(ipv4(fault, backend))
    out = call(ch, kind)
    assert out.code == grpc.StatusCode.INTERNAL and "RST_STREAM" in out.details, out
    assert fault.streams_seen == 1 and backend.attempts == []


@pytest.mark.parametrize("fault", [REFUSE, GOAWAY], indirect=True)
def test_enable_retries_0_turns_transparent_retries_off(client, backend, fault):
    ch = client.channel(ipv4(fault, backend), [("grpc.enable_retries", 0)])
    out = call(ch, "unary")
    assert out.code == grpc.StatusCode.UNAVAILABLE, out
    assert ("RST_STREAM" in out.details) if fault.mode == REFUSE else ("GOAWAY" in out.details), out.details
    assert backend.attempts == []


@pytest.mark.parametrize("fault", [REFUSE], indirect=True)
def test_refused_stream_is_retried_once_per_call(client, fault):
    other = H2FaultServer(REFUSE)
    try:
        ch = client.channel(ipv4(fault, other))
        out = call(ch, "unary")
        assert out.code == grpc.StatusCode.UNAVAILABLE and "RST_STREAM" in out.details, out
        assert fault.streams_seen + other.streams_seen == 2
    finally:
        other.stop()


@pytest.mark.parametrize("fault", [REFUSE], indirect=True)
def test_transparent_retry_counts_toward_neither_max_attempts_nor_metadata(client, fault):
    """maxAttempts 2: refused (transparent) -> UNAVAILABLE (attempt 1) -> OK (attempt 2), three backends."""
    failing, healthy = Backend(), Backend()
    try:
        failing.fallback(UNARY, lambda i: fail())
        ch = client.channel(ipv4(fault, failing, healthy),
                            [("grpc.service_config", service_config(retry_policy(max_attempts=2)))])
        out = call(ch, "unary")
        assert out.code == OK and out.previous_attempts == "1", out
        assert [a.previous for a in failing.attempts_of(UNARY)] == [None]
        assert [a.previous for a in healthy.attempts_of(UNARY)] == ["1"]
        assert fault.streams_seen == 1
    finally:
        failing.stop()
        healthy.stop()


@pytest.mark.parametrize("fault", [UNKNOWN_CODE], indirect=True)
def test_a_status_code_grpc_does_not_define_reads_as_on_grpcio(fault):
    """grpc-status 42: UNKNOWN, with grpcio's words for it, on every shape of a sync unary call and on asyncio
    (where older grpc.aio raises KeyError itself, grpc_retry's call still ends UNKNOWN)."""
    import grpc_retry
    import grpc_retry.aio

    def sync_errors(make):
        seen = []
        with make(fault.target) as channel:
            method = channel.unary_unary(UNARY)
            for invoke in (method, method.with_call, lambda r, **kw: method.future(r, **kw).result()):
                with pytest.raises(grpc.RpcError) as caught:
                    invoke(b"x", timeout=10)
                seen.append((caught.value.code(), caught.value.details()))
        return seen

    async def aio_error(make):
        async with make(fault.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary(UNARY)(b"x", timeout=10)
            return caught.value.code(), caught.value.details()

    expected = sync_errors(grpc.insecure_channel)
    assert expected[0][0] is grpc.StatusCode.UNKNOWN
    assert sync_errors(grpc_retry.insecure_channel) == expected
    ours = asyncio.run(aio_error(grpc_retry.aio.insecure_channel))
    assert ours[0] is grpc.StatusCode.UNKNOWN
    try:
        assert ours == asyncio.run(aio_error(grpc.aio.insecure_channel))
    except KeyError:  # grpc.aio before ~1.8x fails on such a code itself (KeyError: 42): nothing to compare
        pass


# -- asyncio writes waiting for a stream the peer does not allow (SETTINGS_MAX_CONCURRENT_STREAMS 0) ---------------


def _method_config(**policy) -> dict:
    return {"methodConfig": [{"name": [{"service": ECHO_SERVICE}], **policy}]}


def _policy_options(policy: str) -> list:
    """Channel options with no policy, a retry policy or a hedging policy."""
    if policy == "none":
        return []
    config = _method_config(retryPolicy=retry_policy()) if policy == "retry" else _method_config(hedgingPolicy=HEDGING)
    return [("grpc.service_config", json.dumps(config))]


async def _call_tasks() -> set:
    """Tasks but this one and the channel's own (its connectivity watch)."""
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()
            and "_watch_loop" not in getattr(task.get_coro(), "__qualname__", "")}


@pytest.mark.parametrize("fault", [NO_STREAMS], indirect=True)
@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
async def test_aio_a_write_waiting_for_its_stream_ends_with_the_cancelled_call(fault, policy):
    """The attempt's metadata cannot go out, so write() waits (as on grpc.aio); cancel() ends the call, and the
    write raises CancelledError at once, leaving no task behind. (grpc.aio's own write waits on forever there:
    its call never learns that its metadata will not go out.)"""
    import grpc_retry.aio

    async with grpc_retry.aio.insecure_channel(fault.target, options=_policy_options(policy)) as channel:
        before = await _call_tasks()
        call = channel.stream_stream(BIDI)(timeout=30)
        write = asyncio.ensure_future(call.write(b"a"))
        done, _ = await asyncio.wait((write,), timeout=0.3)
        assert not done, "the write went on before the attempt's metadata went out"
        assert call.cancel()
        done, _ = await asyncio.wait((write,), timeout=2)
        assert done and write.cancelled(), "the write still waits after its call was cancelled"
        assert await call.code() == grpc.StatusCode.CANCELLED
        left = await _call_tasks() - before
        if left:  # grpc.aio's own task for the attempt's status ends as C-core reports the cancel
            await asyncio.wait(left, timeout=2)
            left = await _call_tasks() - before
        assert left == set(), "a task outlived its call"


@pytest.mark.parametrize("fault", [NO_STREAMS], indirect=True)
@pytest.mark.parametrize("policy", ["none", "retry", "hedging"])
async def test_aio_cancelling_the_task_that_writes_cancels_the_call(fault, policy):
    """As awaiting the call or reading it: a task cancelled as it waits in write() cancels the RPC (the chaos
    soak's cancel storm: a call ran on after the task awaiting it was cancelled)."""
    import grpc_retry.aio

    async with grpc_retry.aio.insecure_channel(fault.target, options=_policy_options(policy)) as channel:
        call = channel.stream_stream(BIDI)(timeout=30)
        write = asyncio.ensure_future(call.write(b"a"))
        done, _ = await asyncio.wait((write,), timeout=0.3)
        assert not done, "the write went on before the attempt's metadata went out"
        write.cancel()
        await asyncio.wait((write,), timeout=2)
        assert write.cancelled()
        assert call.done() and call.cancelled(), "the call ran on after the task writing to it was cancelled"
        assert await call.code() == grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("fault", [NO_STREAMS], indirect=True)
async def test_aio_a_hedged_write_goes_out_with_the_first_hedge_that_can(fault, backend):
    """pick_first puts the first attempt on the peer that allows no stream; the hedge goes to the backend. The
    call's writes wait for the first hedge whose metadata has gone out, not for the first hedge."""
    import grpc_retry.aio

    config = json.dumps(_method_config(hedgingPolicy=HEDGING))
    async with grpc_retry.aio.insecure_channel(ipv4(fault, backend), options=[("grpc.service_config", config)]) as ch:
        call = ch.stream_stream(BIDI)(timeout=30)
        await asyncio.wait_for(call.write(b"a"), 5)
        await call.done_writing()
        assert [response async for response in call] == [b"a"]
        assert await call.code() == OK
    assert [a.requests for a in backend.attempts_of(BIDI)] == [[b"a"]]
