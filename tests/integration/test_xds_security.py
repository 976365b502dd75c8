"""xDS security (gRFC A29): a channel on an `xds:` target made with grpc.xds_channel_credentials(...) goes whole to
one grpcio channel, whose own xDS client makes the TLS its clusters ask for from the bootstrap's certificate
providers — mTLS, subject-alt-name matchers, certificate rotation — exactly as gRPC does, and never plaintext; with
any other credentials grpc_retry's own xDS client serves the channel and the clusters' TLS does not apply, as on
grpcio.

Each client runs in a process of its own on one control plane (tests/support/control_plane.py), as its xDS node:
grpc_retry's channel on one API, and grpcio's own `grpc.secure_channel(target, xds_channel_credentials(...))` as the
oracle. (grpcio's xDS client, which serves both under xDS credentials, reads its bootstrap in the process that makes
it: each test's clients get theirs, whatever ran before.) The backends are real grpcio servers on loopback, the
certificates are made with openssl (tests/support/pki.py)."""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import grpc
import pytest

pytest.importorskip("envoy")  # (the control plane, in this process, is built on the extra)

from envoy.type.matcher.v3 import string_pb2  # noqa: E402
from support.backend import SERVICE, UNARY, Backend  # noqa: E402
from support.clients import retry_policy, service_config  # noqa: E402
from support.control_plane import CLUSTER, ControlPlane  # noqa: E402
from support.pki import CLIENT_ID, PROVIDER, SERVER_ID, Pki, file_watcher, make_pki, upstream_tls  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, listener, route_config  # noqa: E402

from grpc_retry._version import grpcio_minor  # noqa: E402

OTHER_ID = "spiffe://cluster.local/ns/default/sa/other"     # in no certificate
CALLS = 20
OK = ["OK", ""]
NODE_ID = re.compile(r"\(xDS node ID:[^)]*\)")


# -- certificates ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# -- backends ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Seen:
    """One attempt that reached a handler: the calling client's tag, the peer identities TLS gave it, its
    transport's security type and its grpc-previous-rpc-attempts."""

    client: str
    identities: Tuple[str, ...]
    security: str
    previous: Optional[str]


class MtlsBackend:
    """A grpcio server on a loopback port that speaks TLS only, with the `server` certificate, and requires a client
    certificate that `ca` signed. `first_attempts`: what a call's first attempt gets ("answer", "fail" UNAVAILABLE,
    or "hold" until the client cancels it); later attempts are answered."""

    def __init__(self, pki: Pki, first_attempts: str = "answer") -> None:
        self._first = first_attempts
        self._lock = threading.Lock()
        self.seen: List[Seen] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            SERVICE, {"Unary": grpc.unary_unary_rpc_method_handler(self._unary)})])
        credentials = grpc.ssl_server_credentials([(pki.key("server").read_bytes(), pki.cert("server").read_bytes())],
                                                  root_certificates=pki.cert("ca").read_bytes(),
                                                  require_client_auth=True)
        self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
        self._server.start()

    def _unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = {key: str(value) for key, value in context.invocation_metadata()}
        security = context.auth_context().get("transport_security_type", ())
        seen = Seen(metadata.get("client", ""), tuple(i.decode() for i in context.peer_identities() or ()),
                    ",".join(bytes(kind).decode() for kind in security), metadata.get("grpc-previous-rpc-attempts"))
        with self._lock:
            self.seen.append(seen)
        if seen.previous is None and self._first == "fail":
            context.abort(grpc.StatusCode.UNAVAILABLE, "first attempts fail here")
        if seen.previous is None and self._first == "hold":
            ended = threading.Event()
            context.add_callback(ended.set)
            ended.wait(30)
        return request

    def of(self, client: str) -> List[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.client == client]

    def stop(self) -> None:
        self._server.stop(None).wait()


@pytest.fixture
def mtls(pki: Pki) -> Iterator[Callable[..., MtlsBackend]]:
    made: List[MtlsBackend] = []

    def start(first_attempts: str = "answer") -> MtlsBackend:
        made.append(MtlsBackend(pki, first_attempts))
        return made[-1]
    yield start
    for backend in made:
        backend.stop()


@pytest.fixture
def plaintext() -> Iterator[Backend]:
    backend = Backend()
    yield backend
    backend.stop()


# -- the control plane -------------------------------------------------------------------------------------------

@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    control_plane.set(listener())
    control_plane.set(route_config())
    yield control_plane
    control_plane.close()


def tls_cluster(san: Sequence[string_pb2.StringMatcher] = ()) -> Any:
    """Cluster "c1", whose transport socket asks for TLS: its identity certificate and its CA from PROVIDER, the
    backend's certificate to match one of `san` (none: any the CA signed)."""
    return cluster(lambda message: message.transport_socket.CopyFrom(upstream_tls(san)))


def serve(plane: ControlPlane, port: int, san: Sequence[string_pb2.StringMatcher] = ()) -> None:
    """The TLS cluster, its one endpoint 127.0.0.1:`port`."""
    plane.set(tls_cluster(san))
    plane.set(endpoints(lambda message: message.endpoints[0].lb_endpoints[0].CopyFrom(
        lb_endpoint("127.0.0.1", port))))


# -- clients, each in a process of its own -----------------------------------------------------------------------

# argv[1]: {"kind": "sync" | "aio" (grpc_retry's API) | "grpcio" (grpc's own channel), "credentials": "xds" |
# "insecure" | {"ca", "key", "cert"} (files, for ssl credentials), "options": channel options}. Each line of stdin
# is a command, each line of stdout its answer (JSON); stdin closed, the channel is closed.
_CLIENT = r"""
import asyncio, json, sys, threading, time
import grpc
import grpc.experimental

SETUP = json.loads(sys.argv[1])
KIND, TARGET, METHOD = SETUP["kind"], "xds:///svc", SETUP["method"]
OPTIONS = [tuple(option) for option in SETUP["options"]]
METADATA = (("client", KIND),)


def make(module):
    given = SETUP["credentials"]
    if given == "insecure":
        return module.insecure_channel(TARGET, options=OPTIONS)
    if given == "xds":
        credentials = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    else:
        credentials = grpc.ssl_channel_credentials(*(open(given[name], "rb").read() for name in ("ca", "key", "cert")))
    return module.secure_channel(TARGET, credentials, options=OPTIONS)


if KIND == "aio":
    import grpc_retry.aio

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def made():
        return make(grpc_retry.aio)
    channel = asyncio.run_coroutine_threadsafe(made(), loop).result()

    async def one():
        return await channel.unary_unary(METHOD)(b"x", timeout=10, metadata=METADATA)

    def call():
        return asyncio.run_coroutine_threadsafe(one(), loop).result()

    def close():
        asyncio.run_coroutine_threadsafe(channel.close(), loop).result(10)
else:
    if KIND == "sync":
        import grpc_retry as module
    else:
        module = grpc
    channel = make(module)
    method = channel.unary_unary(METHOD)

    def call():
        return method(b"x", timeout=10, metadata=METADATA)

    close = channel.close


def outcome():
    try:
        call()
        return ["OK", ""]
    except grpc.RpcError as error:
        return [error.code().name, error.details()]


def answer(command):
    if "calls" in command:
        return [outcome() for _ in range(command["calls"])]
    if "until_ok" in command:
        # Call until one succeeds (no event tells a client when its certificate provider read new files).
        started, failures = time.monotonic(), []
        while True:
            got = outcome()
            if got[0] == "OK" or time.monotonic() - started > command["until_ok"]:
                return {"outcome": got, "failures": len(failures), "seconds": time.monotonic() - started}
            failures.append(got)
            time.sleep(0.05)
    if "shape" in command:  # the channel's class, and the target its backends are made for (or: routed per call)
        if getattr(channel, "_router", None) is not None:
            return [f"{type(channel).__module__}.{type(channel).__qualname__}", "routed"]
        target = getattr(getattr(channel, "_subchannels", None), "target", None)
        return [f"{type(channel).__module__}.{type(channel).__qualname__}",
                None if target is None else [target.scheme, list(target.addresses)]]
    if "stats" in command:
        stats = channel.retry_stats()[METHOD]
        return {name: getattr(stats, name) for name in ("calls", "attempts", "retries", "hedges")}
    raise SystemExit(f"unknown command {command}")


for line in sys.stdin:
    print(json.dumps(answer(json.loads(line))), flush=True)
close()
"""


class ClientProcess:
    """A client process on `plane`, as xDS node `kind`, its bootstrap's certificate_providers `providers`."""

    def __init__(self, plane: ControlPlane, kind: str, providers: Dict[str, Any], credentials: Any = "xds",
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        self.kind = kind
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_XDS")}
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = plane.bootstrap(kind, certificate_providers=providers)
        setup = {"kind": kind, "method": UNARY, "credentials": credentials, "options": list(options)}
        self._errors = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen([sys.executable, "-c", _CLIENT, json.dumps(setup)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._errors, text=True, env=env,
                                         cwd=tempfile.gettempdir())
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(line)
        self._answers.put("")

    def send(self, command: Dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()

    def receive(self, timeout: float = 60) -> Any:
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.kind}: no answer in {timeout}s") from None
        if not line:
            self._errors.seek(0)
            raise AssertionError(f"{self.kind}: the client process ended: {self._errors.read()[-3000:]}")
        return normalized(json.loads(line))

    def ask(self, command: Dict[str, Any]) -> Any:
        self.send(command)
        return self.receive()

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._errors.close()


def normalized(answer: Any) -> Any:
    """Each node's ID left out of the details, so that two clients' outcomes compare."""
    if isinstance(answer, str):
        return NODE_ID.sub("(xDS node ID:…)", answer)
    if isinstance(answer, list):
        return [normalized(item) for item in answer]
    if isinstance(answer, dict):
        return {key: normalized(value) for key, value in answer.items()}
    return answer


def together(clients: Sequence[ClientProcess], command: Dict[str, Any]) -> List[Any]:
    """`command` run by each client at once: their answers, in order."""
    for client in clients:
        client.send(command)
    return [client.receive() for client in clients]


@pytest.fixture
def start(plane: ControlPlane, pki: Pki) -> Iterator[Callable[..., ClientProcess]]:
    """start(kind, providers=None, **ClientProcess's) -> ClientProcess; `providers` by default: the trusted
    client certificate and the CA."""
    made: List[ClientProcess] = []

    def begin(kind: str, providers: Optional[Dict[str, Any]] = None, **given: Any) -> ClientProcess:
        if providers is None:
            providers = file_watcher(pki.cert("client"), pki.key("client"), pki.cert("ca"))
        made.append(ClientProcess(plane, kind, providers, **given))
        return made[-1]
    yield begin
    for client in made:
        client.close()


@pytest.fixture(params=["sync", "aio"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def acked(plane: ControlPlane, node: str) -> bool:
    """`node` answered the TLS cluster, and never with a NACK."""
    answers = plane.answers(node, CLUSTER)
    return bool(answers) and not any(answer.nack for answer in answers)


# -- the tests ---------------------------------------------------------------------------------------------------

def test_mtls_with_the_bootstraps_certificates_as_on_grpcio(api: str, plane: ControlPlane, start: Any,
                                                            mtls: Any) -> None:
    """A backend that requires a client certificate: every call succeeds over TLS, the client's certificate (from
    the file_watcher provider) presented on each."""
    backend = mtls()
    serve(plane, backend.port)
    ours, theirs = start(api), start("grpcio")
    assert together([ours, theirs], {"calls": CALLS}) == [[OK] * CALLS] * 2
    for kind in (api, "grpcio"):
        assert backend.of(kind) == [Seen(kind, (CLIENT_ID,), "ssl", None)] * CALLS
        assert acked(plane, kind)


def test_a_cluster_asking_for_tls_never_reaches_a_plaintext_backend_as_on_grpcio(
        api: str, plane: ControlPlane, start: Any, plaintext: Backend) -> None:
    """Every call fails UNAVAILABLE (the first with the TLS handshake's error, in grpcio's words), and none
    reaches the backend: no fallback to plaintext."""
    serve(plane, plaintext.port)
    ours, theirs = start(api), start("grpcio")
    mine, oracle = together([ours, theirs], {"calls": 5})
    assert [code for code, _ in mine] == [code for code, _ in oracle] == ["UNAVAILABLE"] * 5
    assert mine[0] == oracle[0] and "Tls handshake failed" in mine[0][1], mine[0]
    assert plaintext.attempts == []  # (no call of either reached its handler)


@pytest.mark.parametrize("matcher, ok", [
    (string_pb2.StringMatcher(exact=SERVER_ID), True),
    (string_pb2.StringMatcher(prefix="spiffe://cluster.local/ns/default/"), True),
    (string_pb2.StringMatcher(exact=OTHER_ID), False),
], ids=["exact", "prefix", "not the backends"])
def test_the_clusters_san_matchers_as_on_grpcio(api: str, plane: ControlPlane, start: Any, mtls: Any,
                                                matcher: string_pb2.StringMatcher, ok: bool) -> None:
    """The backend's certificate must match one of the cluster's match_subject_alt_names: when none matches, no
    call reaches the backend."""
    backend = mtls()
    serve(plane, backend.port, [matcher])
    ours, theirs = start(api), start("grpcio")
    mine, oracle = together([ours, theirs], {"calls": 5})
    if ok:
        assert mine == oracle == [OK] * 5
        for kind in (api, "grpcio"):
            assert backend.of(kind) == [Seen(kind, (CLIENT_ID,), "ssl", None)] * 5
        return
    assert [code for code, _ in mine] == [code for code, _ in oracle] == ["UNAVAILABLE"] * 5
    assert mine[0] == oracle[0], (mine[0], oracle[0])
    assert "SANs from certificate did not match SANs from xDS control plane" in mine[0][1]
    assert backend.seen == []


@pytest.mark.parametrize("cause", ["a plaintext backend", "no SAN matched"])
def test_calls_failing_fast_on_a_failing_tls_cluster_carry_grpcios_details(api: str, plane: ControlPlane,
                                                                           start: Any, mtls: Any, plaintext: Backend,
                                                                           cause: str) -> None:
    """Drop-in: after the first call found the TLS handshake failing, grpcio's channel is in TRANSIENT_FAILURE and
    the next calls fail fast; each carries the last connection error in grpcio's words, as grpcio's calls do."""
    if cause == "a plaintext backend":
        serve(plane, plaintext.port)
    else:
        serve(plane, mtls().port, [string_pb2.StringMatcher(exact=OTHER_ID)])
    ours, theirs = start(api), start("grpcio")
    mine, oracle = together([ours, theirs], {"calls": 5})
    assert len({tuple(outcome) for outcome in oracle}) == 1, oracle  # (grpcio's: five times the same)
    assert mine == oracle


def test_a_missing_certificate_fails_calls_and_never_falls_back_to_plaintext(api: str, plane: ControlPlane,
                                                                            start: Any, pki: Pki,
                                                                            plaintext: Backend) -> None:
    """The provider's certificate file is not there: every call fails UNAVAILABLE, as grpcio's, and none reaches
    the (plaintext) backend: a cluster that asks for TLS gets no connection without it. Where grpcio says only
    that it could not make the handshaker, grpc_retry also names the provider and the file."""
    serve(plane, plaintext.port)
    missing = pki.folder / "no-such-client.pem"
    providers = file_watcher(missing, pki.key("client"), pki.cert("ca"))
    ours, theirs = start(api, providers), start("grpcio", providers)
    mine, oracle = together([ours, theirs], {"calls": 5})
    assert [code for code, _ in mine] == [code for code, _ in oracle] == ["UNAVAILABLE"] * 5, (mine, oracle)
    named = f" (certificate provider '{PROVIDER}': certificate_file '{missing}': No such file or directory)"
    assert "Failed to create security handshaker" in oracle[0][1] and named not in oracle[0][1], oracle[0]
    assert [details for _, details in mine] == [details + named for _, details in oracle], (mine, oracle)
    assert plaintext.attempts == []


def test_a_rotated_client_certificate_serves_the_same_channel_as_on_grpcio(api: str, plane: ControlPlane,
                                                                          start: Any, mtls: Any, pki: Pki,
                                                                          tmp_path: Path) -> None:
    """The provider's files start with a certificate another CA signed: the backend refuses every call. Once the
    files hold one its CA signed, the same channel's calls succeed, with that certificate (the provider reads its
    files every second; the channel reconnects after its backoff), as grpcio's own channel's do from 1.85."""
    backend = mtls()
    serve(plane, backend.port)
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    shutil.copyfile(pki.cert("rogue"), cert)
    shutil.copyfile(pki.key("rogue"), key)
    providers = file_watcher(cert, key, pki.cert("ca"))
    ours, theirs = start(api, providers), start("grpcio", providers)
    before = together([ours, theirs], {"calls": 3})
    assert [[code for code, _ in outcomes] for outcomes in before] == [["UNAVAILABLE"] * 3] * 2
    assert backend.seen == []
    for source, into in ((pki.key("client"), key), (pki.cert("client"), cert)):  # each file replaced whole
        shutil.copyfile(source, into.with_suffix(".new"))
        os.replace(into.with_suffix(".new"), into)
    # (grpcio 1.85's own channel takes the new certificate too; 1.70's went on failing past the 20 s)
    clients, kinds = ([ours, theirs], [api, "grpcio"]) if grpcio_minor(grpc.__version__) >= (1, 85) else \
        ([ours], [api])
    after = together(clients, {"until_ok": 20})
    assert [outcome["outcome"] for outcome in after] == [OK] * len(clients), after
    assert together(clients, {"calls": 5}) == [[OK] * 5] * len(clients)
    assert {seen.identities for seen in backend.seen} == {(CLIENT_ID,)}
    assert [len(backend.of(kind)) for kind in kinds] == [6] * len(kinds)


@pytest.mark.parametrize("policy", ["retry", "hedging"])
def test_under_xds_credentials_grpcio_serves_the_channel_whole_and_grpc_retry_retries_and_hedges(
        api: str, plane: ControlPlane, start: Any, mtls: Any, policy: str) -> None:
    """The channel is one grpcio channel given the whole target (not routed by grpc_retry's xDS client), over mTLS; the
    service config's retry policy (each call's first attempt fails) or hedging policy (each call's first attempt
    is never answered) still applies, by grpc_retry: every call succeeds on its second attempt."""
    if policy == "retry":
        config = service_config(retry_policy(max_attempts=2))
    else:
        config = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "hedgingPolicy": {
            "maxAttempts": 2, "hedgingDelay": "0.05s"}}]})
    backend = mtls("fail" if policy == "retry" else "hold")
    serve(plane, backend.port)
    ours = start(api, options=[("grpc.service_config", config)])
    assert ours.ask({"shape": True}) == [f"grpc_retry.{api}._channel.Channel", ["whole", ["xds:///svc"]]]
    assert ours.ask({"calls": CALLS}) == [OK] * CALLS
    # (A hedge may reach the backend before its call's first attempt, when both waited for the connection.)
    assert collections.Counter(backend.seen) == {Seen(api, (CLIENT_ID,), "ssl", None): CALLS,
                                                 Seen(api, (CLIENT_ID,), "ssl", "1"): CALLS}
    extra = "retries" if policy == "retry" else "hedges"
    assert ours.ask({"stats": True}) == {"calls": CALLS, "attempts": 2 * CALLS, "retries": 0, "hedges": 0,
                                         extra: CALLS}


@pytest.mark.parametrize("credentials", ["insecure", "ssl"])
def test_under_other_credentials_grpc_retrys_xds_client_serves_and_the_clusters_tls_does_not_apply(
        api: str, plane: ControlPlane, start: Any, mtls: Any, plaintext: Backend, pki: Pki,
        credentials: str) -> None:
    """A29: a cluster's TLS applies under xDS credentials only. The cluster asks for TLS with a certificate the
    backend would refuse (the provider holds the rogue one) and a SAN no backend has; yet insecure credentials
    reach a plaintext backend in plaintext, and ssl credentials (their own client certificate, the name checked
    `localhost`) reach the mTLS backend — through grpc_retry's own xDS client as through grpcio's."""
    given: Any = credentials
    options: List[Tuple[str, Any]] = []
    if credentials == "insecure":
        port = plaintext.port
    else:
        backend = mtls()
        port = backend.port
        given = {"ca": str(pki.cert("ca")), "key": str(pki.key("client")), "cert": str(pki.cert("client"))}
        options = [("grpc.ssl_target_name_override", "localhost")]
    serve(plane, port, [string_pb2.StringMatcher(exact=OTHER_ID)])
    rogue = file_watcher(pki.cert("rogue"), pki.key("rogue"), pki.cert("rogue-ca"))
    ours = start(api, rogue, credentials=given, options=options)
    theirs = start("grpcio", rogue, credentials=given, options=options)
    assert ours.ask({"shape": True}) == [f"grpc_retry.{api}._channel.Channel", "routed"]
    assert together([ours, theirs], {"calls": 5}) == [[OK] * 5] * 2
    if credentials == "insecure":
        assert sorted(attempt.metadata["client"] for attempt in plaintext.attempts_of(UNARY)) == \
            sorted(["grpcio", api] * 5)
    else:
        assert plaintext.attempts == []
        for kind in (api, "grpcio"):  # (the ssl credentials' certificate, not the provider's rogue one)
            assert backend.of(kind) == [Seen(kind, (CLIENT_ID,), "ssl", None)] * 5
    assert acked(plane, api) and acked(plane, "grpcio")


def test_under_xds_credentials_a_cluster_asking_for_no_tls_gets_the_fallback_as_on_grpcio(
        api: str, plane: ControlPlane, start: Any, plaintext: Backend) -> None:
    """A cluster with no transport socket: the xDS credentials' fallback (here insecure) makes its connections, and
    every call reaches the plaintext backend, on grpc_retry's channel as on grpcio's."""
    plane.set(cluster())
    plane.set(endpoints(lambda message: message.endpoints[0].lb_endpoints[0].CopyFrom(
        lb_endpoint("127.0.0.1", plaintext.port))))
    ours, theirs = start(api), start("grpcio")
    assert together([ours, theirs], {"calls": 5}) == [[OK] * 5] * 2
    assert sorted(attempt.metadata["client"] for attempt in plaintext.attempts_of(UNARY)) == sorted(["grpcio", api] * 5)
    assert acked(plane, api) and acked(plane, "grpcio")
