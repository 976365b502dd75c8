"""Several backends behind one channel: targets, pickers that keep a call off the backends it already used,
dead addresses, and what a call does when no backend is up. Every test runs on both APIs."""

from __future__ import annotations

import collections
import json
import socket
import subprocess
import threading
import time
from concurrent import futures

import grpc
import pytest
from support.backend import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY, Backend, fail
from support.clients import retry_policy, service_config

import grpc_retry
import grpc_retry.aio
from grpc_retry._backends import resolution

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
CALL_ID = "x-call-id"
# Reconnect soon after a failed connection, so that tests which bring a backend up do not wait a second.
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                  ("grpc.max_reconnect_backoff_ms", 200)]


def ipv4(*ports: int) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)


def dead_port() -> int:
    """A loopback port that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def options(lb: str, via: str = "option", max_attempts: int = 2) -> list:
    """A retry policy of `max_attempts` on UNAVAILABLE, with the LB policy `lb` set by channel option or by the
    service config's loadBalancingConfig."""
    config = json.loads(service_config(retry_policy(max_attempts=max_attempts)))
    if via == "config":
        config["loadBalancingConfig"] = [{lb: {}}]
        return [("grpc.service_config", json.dumps(config))]
    return [("grpc.service_config", json.dumps(config)), ("grpc.lb_policy_name", lb)]


def paths(backends, method: str = UNARY) -> dict:
    """Call id -> the backends (indices) its attempts reached, in order of arrival."""
    seen = collections.defaultdict(list)
    for index, backend in enumerate(backends):
        for attempt in backend.attempts_of(method):
            seen[attempt.metadata[CALL_ID]].append((attempt.arrived, index))
    return {call: [index for _, index in sorted(hops)] for call, hops in seen.items()}


def tag(n: int):
    return ((CALL_ID, str(n)),)


def test_round_robin_reaches_every_backend_after_its_first_call(client):
    """round_robin makes the subchannels its first call did not pick off that call's path, a few at a time (so
    that a channel of many addresses answers its first call without waiting for them all): all of them, soon."""
    from grpc_retry._backends import subchannels

    servers = [Backend(workers=2) for _ in range(2 * subchannels.CONNECT_STEP + 2)]  # three steps' worth
    try:
        ch = client.channel(ipv4(*(s.port for s in servers)), options("round_robin"))
        assert ch.unary(UNARY, b"x", timeout=10).code == OK
        deadline = time.monotonic() + 20
        while any(not s.attempts_of(UNARY) for s in servers) and time.monotonic() < deadline:
            assert ch.unary(UNARY, b"x", timeout=10).code == OK
        assert [s.port for s in servers if not s.attempts_of(UNARY)] == []
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize("lb, via", [("pick_first", "option"), ("round_robin", "option"),
                                     ("round_robin", "config")])
def test_retry_never_revisits_a_backend(client, backends, lb, via):
    backends[0].fallback(UNARY, lambda i: fail())
    ch = client.channel(ipv4(*(b.port for b in backends)), options(lb, via))
    outcomes = [ch.unary(UNARY, b"x", timeout=10, metadata=tag(n)) for n in range(12)]
    handles = [ch.start_call("unary", UNARY, b"x", timeout=10, metadata=tag(n)) for n in range(12, 36)]
    outcomes += [handle.result() for handle in handles]
    assert [o.code for o in outcomes] == [OK] * 36
    seen = paths(backends)
    assert len(seen) == 36
    for call, path in seen.items():
        assert len(path) == len(set(path)) and path[-1] != 0, (call, path)
    firsts = collections.Counter(path[0] for path in seen.values())
    if lb == "pick_first":  # in order: the failing first backend, READY all along, then the next
        assert all(path == [0, 1] for path in seen.values()), seen
    else:
        assert set(firsts) == {0, 1, 2}, firsts  # round_robin spreads first attempts over every backend


def test_pick_first_keeps_to_the_first_backend_once_a_retry_connected_the_next(client, backends):
    """A channel's first call fails on backend 0 and its retry connects backend 1: the next calls still go to
    backend 0, READY all along (the picker must see it READY as soon as that first attempt connected it, however
    soon after its subchannel was made that was). Several channels: each is one chance to read it too early."""
    for n in range(6):
        backends[0].script(UNARY, fail())
        ch = client.channel(ipv4(*(b.port for b in backends)), options("pick_first"))
        outcomes = [ch.unary(UNARY, b"x", timeout=10, metadata=tag(10 * n + k)) for k in range(3)]
        assert [o.code for o in outcomes] == [OK] * 3
        seen = paths(backends)
        assert [seen[str(10 * n + k)] for k in range(3)] == [[0, 1], [0], [0]], (n, seen)


@pytest.mark.parametrize("kind, method", [("server_stream", SERVER_STREAM), ("client_stream", CLIENT_STREAM),
                                          ("bidi", BIDI)])
def test_streaming_retry_goes_elsewhere(client, backends, kind, method):
    backends[0].fallback(method, lambda i: fail())
    ch = client.channel(ipv4(*(b.port for b in backends)), options("pick_first"))
    payload = b"x" if kind == "server_stream" else [b"a", b"b"]
    for n in range(4):
        out = getattr(ch, kind)(method, payload, timeout=10, metadata=tag(n))
        assert out.code == OK and out.responses, out
    seen = paths(backends, method)
    # Every call takes the failing backend first (pick_first order: it stays READY), then the next.
    assert all(path == [0, 1] for path in seen.values()), seen


@pytest.mark.parametrize("lb", ["pick_first", "round_robin"])
@pytest.mark.parametrize("wait_for_ready", [None, True])
def test_dead_addresses_are_skipped(client, backends, lb, wait_for_ready):
    live = [backends[0].port, backends[1].port]
    target = ipv4(dead_port(), live[0], dead_port(), live[1])
    ch = client.channel(target, [("grpc.lb_policy_name", lb)])  # no retry policy: skipping is not a retry
    for n in range(8):
        out = ch.unary(UNARY, b"x", timeout=10, metadata=tag(n), wait_for_ready=wait_for_ready)
        assert out.code == OK, out
        assert "grpc-previous-rpc-attempts" not in out.trailing
    served = [len(b.attempts_of(UNARY)) for b in backends[:2]]
    assert sum(served) == 8
    if lb == "round_robin":
        # Both live backends take calls once both are connected (on a loaded machine the second may still be
        # connecting during the first 8 calls): go on until it does, within a bound.
        deadline = time.monotonic() + 10
        while min(served) == 0 and time.monotonic() < deadline:
            assert ch.unary(UNARY, b"x", timeout=10, wait_for_ready=wait_for_ready).code == OK
            served = [len(b.attempts_of(UNARY)) for b in backends[:2]]
        assert min(served) > 0, served
    else:
        assert served == [8, 0]


@pytest.mark.parametrize("form", ["dns:///localhost:{port}", "localhost:{port}", "dns:localhost:{port}"])
def test_dns_targets(client, backend, form):
    ch = client.channel(form.format(port=backend.port))
    out = ch.unary(UNARY, b"hello", timeout=10)
    assert (out.code, out.response) == (OK, b"hello")
    assert len(backend.attempts_of(UNARY)) == 1


def test_dns_is_resolved_again_when_every_address_failed(client, backend, monkeypatch):
    """The name first resolves to a dead address; once it has failed, the next lookup (not before the minimum
    interval) finds the live one, and a call that waits for ready goes there."""
    answers = [[f"ipv4:127.0.0.1:{dead_port()}"], [f"ipv4:127.0.0.1:{backend.port}"]]
    lookups = []

    def resolve(target):
        lookups.append(target.host)
        return answers[min(len(lookups), 2) - 1]

    monkeypatch.setattr(resolution, "lookup", resolve)
    ch = client.channel(f"dns:///backends.example:{backend.port}", [("grpc.dns_min_time_between_resolutions_ms", 300)])
    assert ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE
    assert ch.unary(UNARY, b"x", timeout=10, wait_for_ready=True).code == OK
    assert lookups == ["backends.example"] * 2 and len(backend.attempts_of(UNARY)) == 1


def test_dns_failure_fails_fast_with_the_resolver_error(client, monkeypatch):
    def resolve(target):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(resolution, "lookup", resolve)
    out = client.channel("dns:///nowhere.example:443").unary(UNARY, b"x", timeout=10)
    assert out.code == UNAVAILABLE and "nowhere.example" in out.details, out


def test_fail_fast_and_wait_for_ready_with_no_backend_up(client):
    port = dead_port()
    ch = client.channel(ipv4(port), FAST_RECONNECT)
    failed = ch.unary(UNARY, b"x", timeout=10)
    assert failed.code == UNAVAILABLE, failed
    expired = ch.unary(UNARY, b"x", timeout=0.3, wait_for_ready=True)
    assert expired.code == grpc.StatusCode.DEADLINE_EXCEEDED, expired
    waiting = ch.start_call("unary", UNARY, b"late", timeout=20, wait_for_ready=True)
    backend = Backend(port=port)
    try:
        out = waiting.result()
        assert (out.code, out.response) == (OK, b"late")
        assert len(backend.attempts_of(UNARY)) == 1
    finally:
        backend.stop()


def test_wait_for_ready_outlasts_the_first_connection_failure(client):
    """A waiting call started while no backend is up goes to the first one that comes up, whichever."""
    ports = [dead_port(), dead_port()]
    ch = client.channel(ipv4(*ports), FAST_RECONNECT)
    assert ch.unary(UNARY, b"x", timeout=10).code == UNAVAILABLE  # both addresses tried and failed
    waiting = ch.start_call("unary", UNARY, b"x", timeout=20, wait_for_ready=True)
    backend = Backend(port=ports[1])
    try:
        assert waiting.result().code == OK
        assert len(backend.attempts_of(UNARY)) == 1
    finally:
        backend.stop()


@pytest.mark.parametrize("target", ["ipv4:", "ipv4:300.1.1.1:80", "ipv4:[::1]:80", "ipv6:[::1", "ipv6:127.0.0.1:80",
                                    "unix:", "host:port", "host:0", "127.0.0.1:99999", "dns:///", "dns://x",
                                    "http://host:80", "", "a:b:c"])
def test_unparseable_target_raises_at_creation(client, target):
    with pytest.raises(ValueError):
        client.make_channel(target)


def test_connectivity_aggregates_subchannels(client, backend):
    """The channel is READY once any backend is, even when the first address is dead (pick_first moves on)."""
    ch = client.channel(ipv4(dead_port(), backend.port))
    if client.api == "aio":
        async def ready():
            await ch.channel.channel_ready()
            return ch.channel.get_state()

        assert ch.run(ready(), 10) == grpc.ChannelConnectivity.READY
        return
    states, ready = [], threading.Event()

    def callback(state):
        states.append(state)
        if state == grpc.ChannelConnectivity.READY:
            ready.set()

    ch.channel.subscribe(callback, try_to_connect=True)
    try:
        assert ready.wait(10), states
    finally:
        ch.channel.unsubscribe(callback)
    assert all(a != b for a, b in zip(states, states[1:], strict=False)), states  # changes only
    assert grpc.channel_ready_future(ch.channel).result(timeout=10) is None


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """A TLS echo server whose certificate names `localhost` only (not 127.0.0.1)."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "grpc_retry.test.Echo", {"Unary": grpc.unary_unary_rpc_method_handler(lambda request, context: request)})])
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
    server.start()
    yield port, grpc.ssl_channel_credentials(cert.read_bytes())
    server.stop(None)


@pytest.mark.parametrize("target, expected", [("localhost:{port}", OK), ("dns:///localhost:{port}", OK),
                                              ("ipv4:127.0.0.1:{port}", UNAVAILABLE)])
def test_tls_checks_the_target_name_not_the_resolved_address(client, tls_server, target, expected):
    """Subchannels dial the resolved address but verify the certificate against the target's host name."""
    port, credentials = tls_server
    target = target.format(port=port)
    if client.api == "sync":
        with grpc_retry.secure_channel(target, credentials) as channel:
            try:
                code = OK if channel.unary_unary(UNARY)(b"x", timeout=10) == b"x" else None
            except grpc.RpcError as error:
                code = error.code()
    else:
        async def call():
            async with grpc_retry.aio.secure_channel(target, credentials) as channel:
                try:
                    return OK if await channel.unary_unary(UNARY)(b"x", timeout=10) == b"x" else None
                except grpc.aio.AioRpcError as error:
                    return error.code()

        code = client.run_in_loop(call())
    assert code == expected


@pytest.mark.parametrize("target", ["ipv4:127.0.0.1:{port}", "127.0.0.1:{port}", "localhost:{port}"])
def test_tls_name_override_is_honoured_as_grpcio_does(tls_server, target):
    """grpc.ssl_target_name_override names the certificate to expect (and the authority), as on grpcio."""
    port, credentials = tls_server
    target = target.format(port=port)
    options = [("grpc.ssl_target_name_override", "localhost")]
    outcomes = []
    for make in (grpc.secure_channel, grpc_retry.secure_channel):
        with make(target, credentials, options=options) as channel:
            try:
                outcomes.append(channel.unary_unary(UNARY).with_call(b"x", timeout=10)[0])
            except grpc.RpcError as error:
                outcomes.append((error.code(), error.details()))
    assert outcomes == [b"x", b"x"]
