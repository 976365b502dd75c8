"""grpc_retry's ADS client against a real control plane (tests/support/control_plane.py): subscriptions, ACK and
NACK (the same as grpcio's own xDS client, run beside it, answers), a rejected update that keeps the last good
value, resources that do not exist or are deleted, a stream that restarts with its cache, one stream per server
shared by every user."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, List, Tuple

import pytest

pytest.importorskip("envoy")

from envoy.config.core.v3 import config_source_pb2  # noqa: E402
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2  # noqa: E402
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2  # noqa: E402
from support.control_plane import LISTENER, ControlPlane  # noqa: E402

from grpc_retry._backends.xds import resources  # noqa: E402
from grpc_retry._backends.xds.bootstrap import parse  # noqa: E402
from grpc_retry._backends.xds.client import ACKED, DOES_NOT_EXIST, NACKED, Watcher, XdsClient  # noqa: E402


def listener(name: str, route: str = "route-1", valid: bool = True) -> listener_pb2.Listener:
    manager = http_connection_manager_pb2.HttpConnectionManager(
        rds=http_connection_manager_pb2.Rds(route_config_name=route,
                                            config_source=config_source_pb2.ConfigSource(
                                                ads=config_source_pb2.AggregatedConfigSource())),
        http_filters=[http_connection_manager_pb2.HttpFilter(name="router")])
    manager.http_filters[0].typed_config.type_url = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    message = listener_pb2.Listener(name=name)
    if valid:
        message.api_listener.CopyFrom(api_listener_pb2.ApiListener())
        message.api_listener.api_listener.Pack(manager)
    return message


class Recorder(Watcher):
    def __init__(self) -> None:
        self.events: List[Tuple[str, str, Any]] = []
        self.times: List[float] = []  # when each event came
        self._changed = threading.Condition()

    def _add(self, event: Tuple[str, str, Any]) -> None:
        with self._changed:
            self.events.append(event)
            self.times.append(time.monotonic())
            self._changed.notify_all()

    def on_resource(self, name: str, value: Any) -> None:
        self._add(("resource", name, value))

    def on_does_not_exist(self, name: str) -> None:
        self._add(("does_not_exist", name, None))

    def on_error(self, name: str, error: str) -> None:
        self._add(("error", name, error))

    def wait(self, count: int, timeout: float = 10.0) -> List[Tuple[str, str, Any]]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.events) >= count, timeout), self.events
            return list(self.events)


@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    yield control_plane
    control_plane.close()


def client_of(plane: ControlPlane, node: str, features: Tuple[str, ...] = (), timeout: float = 15.0) -> XdsClient:
    bootstrap = parse(plane.bootstrap(node, features))
    return XdsClient(bootstrap.xds_servers[0], bootstrap.node, timeout=timeout)


_GRPCIO = """
import sys, grpc
channel = grpc.insecure_channel("xds:///svc")
channel.subscribe(lambda state: None, try_to_connect=True)
sys.stdin.read()
"""


@pytest.fixture
def grpcio_client(plane: ControlPlane) -> Iterator[None]:
    """grpcio's own xDS client, node "grpcio", watching the Listener "svc" (in a process of its own: grpcio reads
    its bootstrap once)."""
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("grpcio"), "GRPC_VERBOSITY": "NONE"}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    process = subprocess.Popen([sys.executable, "-c", _GRPCIO], stdin=subprocess.PIPE, env=env)
    yield
    assert process.stdin is not None
    process.stdin.close()
    process.wait(10)


def test_updates_are_acked_and_a_rejected_one_nacked_as_grpcio_does(plane: ControlPlane, grpcio_client: None) -> None:
    client = client_of(plane, "grpc_retry")
    watcher = Recorder()
    try:
        good = plane.set(listener("svc"))
        client.watch(resources.LISTENER, "svc", watcher)
        (event,) = watcher.wait(1)
        assert event[:2] == ("resource", "svc") and event[2].route_config_name == "route-1"
        for node in ("grpc_retry", "grpcio"):
            answer = plane.wait_answer(node, LISTENER, good)
            assert not answer.nack and answer.version == str(good)
        bad = plane.set(listener("svc", valid=False))
        assert watcher.wait(2)[1][:2] == ("error", "svc")
        ours, theirs = (plane.wait_answer(node, LISTENER, bad) for node in ("grpc_retry", "grpcio"))
        assert ours.nack and theirs.nack
        assert ours.version == theirs.version == str(good)  # a NACK carries the version last accepted
        assert "neither address nor ApiListener" in ours.error
        (held,) = client.snapshot()
        assert (held["status"], held["version"]) == (NACKED, str(good))  # the last good value still serves
        fixed = plane.set(listener("svc", route="route-2"))
        assert watcher.wait(3)[2][2].route_config_name == "route-2"
        assert not plane.wait_answer("grpc_retry", LISTENER, fixed).nack
        assert client.snapshot()[0]["status"] == ACKED
    finally:
        client.close()


def test_a_resource_never_sent_does_not_exist(plane: ControlPlane) -> None:
    client = client_of(plane, "n", timeout=0.3)
    watcher = Recorder()
    try:
        client.watch(resources.LISTENER, "missing", watcher)
        assert watcher.wait(1) == [("does_not_exist", "missing", None)]
        assert client.snapshot()[0]["status"] == DOES_NOT_EXIST
        plane.set(listener("missing"))  # sent later: it exists after all
        assert watcher.wait(2)[1][:2] == ("resource", "missing")
    finally:
        client.close()


@pytest.mark.parametrize("features, deleted", [((), True), (("ignore_resource_deletion",), False)])
def test_a_listener_missing_from_a_response_is_deleted_unless_ignored(plane: ControlPlane, features: Tuple[str, ...],
                                                                     deleted: bool) -> None:
    client = client_of(plane, "n", features)
    watcher = Recorder()
    try:
        plane.set(listener("a"))
        plane.set(listener("b"))
        client.watch(resources.LISTENER, "a", watcher)
        client.watch(resources.LISTENER, "b", watcher)
        watcher.wait(2)
        version = plane.remove(LISTENER, "a")
        plane.wait_answer("n", LISTENER, version)
        if deleted:
            assert watcher.wait(3)[2] == ("does_not_exist", "a", None)
        else:
            assert len(watcher.events) == 2
            assert {r["name"]: r["status"] for r in client.snapshot()} == {"a": ACKED, "b": ACKED}
    finally:
        client.close()


def test_a_restarted_stream_subscribes_again_with_its_versions(plane: ControlPlane) -> None:
    client = client_of(plane, "n")
    watcher = Recorder()
    try:
        version = plane.set(listener("svc"))
        client.watch(resources.LISTENER, "svc", watcher)
        plane.wait_answer("n", LISTENER, version)
        before = len(plane.requests)
        plane.drop_streams()
        plane.wait_for(lambda: any(r.type_url == LISTENER and not r.nonce for r in plane.requests[before:]),
                       what="the subscription sent again")
        again = next(r for r in plane.requests[before:] if r.type_url == LISTENER and not r.nonce)
        assert again.version == str(version) and again.names == ("svc",)
        plane.wait_for(lambda: len(plane.answers("n", LISTENER)) >= 2, what="the resent response answered")
        assert len(watcher.events) == 1  # the same resource again: nothing new to tell
    finally:
        client.close()


def test_a_management_server_back_from_an_outage_is_followed_within_a_second(plane: ControlPlane,
                                                                            grpcio_client: None) -> None:
    """Stopped for 3 s, then serving again on the same port with a changed Listener: both clients subscribe
    again, and the change reaches the watcher, within a second of its return."""
    client = client_of(plane, "grpc_retry")
    watcher = Recorder()
    try:
        version = plane.set(listener("svc"))
        client.watch(resources.LISTENER, "svc", watcher)
        watcher.wait(1)
        for node in ("grpc_retry", "grpcio"):
            plane.wait_answer(node, LISTENER, version)
        plane.stop()
        time.sleep(3)  # the outage (its length is the scenario)
        plane.set(listener("svc", route="route-2"))
        seen = len(plane.requests)
        back = time.monotonic()
        plane.start()
        took = {}

        def subscribed() -> bool:
            for r in plane.requests[seen:]:
                took.setdefault(r.node, time.monotonic() - back)
            return len(took) == 2
        plane.wait_for(subscribed, 10, "both clients to subscribe again")
        def changed() -> List[float]:
            return [t - back for e, t in zip(watcher.events, watcher.times, strict=True)
                    if e[0] == "resource" and e[2].route_config_name == "route-2"]
        with watcher._changed:
            assert watcher._changed.wait_for(changed, 10)
        (changed_after,) = changed()
        print(f"subscribed again after: {took}; the change told after {changed_after:.2f}s")
        assert took["grpc_retry"] < 1.0 and changed_after < 1.0
    finally:
        client.close()


def test_one_stream_per_server_for_every_user(plane: ControlPlane) -> None:
    """... and the last release leaves no thread of it running (one left to the interpreter's exit can hold a lock
    of grpcio's that the exit then waits on)."""
    bootstrap = parse(plane.bootstrap("shared"))
    clients = [XdsClient.acquire(bootstrap.xds_servers[0], bootstrap.node) for _ in range(5)]
    try:
        assert all(c is clients[0] for c in clients)
        watcher = Recorder()
        plane.set(listener("svc"))
        clients[0].watch(resources.LISTENER, "svc", watcher)
        watcher.wait(1)
        assert plane.streams() == 1
    finally:
        for client in clients:
            client.release()
    threads = [clients[0]._thread, clients[0]._follower, *clients[0]._writers]
    assert len(threads) == 3 and not any(t.is_alive() for t in threads)
    plane.wait_for(lambda: not plane._streams, what="the stream closed with its last user")


def test_a_client_closed_as_its_channel_connects_leaves_no_thread_failing(plane: ControlPlane) -> None:
    """Closed at any moment of its channel's connection, its channel's state is no longer watched once the channel
    closes: a thread that watched it then would fail, with a traceback on stderr (pytest fails the test)."""
    bootstrap = parse(plane.bootstrap("brief"))
    for k in range(20):
        client = XdsClient(bootstrap.xds_servers[0], bootstrap.node)
        time.sleep(k / 2000)
        client.close()
        assert not client._follower.is_alive()


def test_an_unreachable_server_is_an_error_for_its_watchers() -> None:
    bootstrap = parse('{"xds_servers": [{"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}]}')
    client = XdsClient(bootstrap.xds_servers[0], bootstrap.node)
    watcher = Recorder()
    try:
        client.watch(resources.LISTENER, "svc", watcher)
        event = watcher.wait(1)[0]
        assert event[:2] == ("error", "svc") and "127.0.0.1:1" in event[2]
    finally:
        client.close()


def test_a_watch_begun_after_the_server_failed_hears_of_it_at_once() -> None:
    """A watcher that comes after the others were told the server cannot be reached is told so too (its channel
    will not say so again), as it is whether it comes before or after the channel's first state."""
    bootstrap = parse('{"xds_servers": [{"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}]}')
    client = XdsClient(bootstrap.xds_servers[0], bootstrap.node)
    first, later = Recorder(), Recorder()
    try:
        client.watch(resources.LISTENER, "svc", first)
        told = first.wait(1)[0]
        client.watch(resources.LISTENER, "other", later)
        assert later.wait(1, timeout=1.0)[0] == ("error", "other", told[2])
    finally:
        client.close()


def test_a_management_server_behind_tls(tmp_path: Any) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    plane = ControlPlane(tls=(key.read_bytes(), cert.read_bytes()))
    try:
        version = plane.set(listener("svc"))
        trusted = parse(plane.bootstrap("tls", creds={"type": "tls", "config": {"ca_certificate_file": str(cert)}}))
        client = XdsClient(trusted.xds_servers[0], trusted.node)
        watcher = Recorder()
        try:
            client.watch(resources.LISTENER, "svc", watcher)
            assert watcher.wait(1)[0][:2] == ("resource", "svc")
            assert not plane.wait_answer("tls", LISTENER, version).nack
        finally:
            client.close()
        untrusted = parse(plane.bootstrap("other", creds={"type": "tls"}))  # the system's roots: not this one's
        client = XdsClient(untrusted.xds_servers[0], untrusted.node)
        watcher = Recorder()
        try:
            client.watch(resources.LISTENER, "svc", watcher)
            assert watcher.wait(1)[0][:2] == ("error", "svc")
        finally:
            client.close()
        missing = parse(plane.bootstrap("x", creds={"type": "tls", "config": {"ca_certificate_file": "/nope.pem"}}))
        with pytest.raises(ValueError, match="ca_certificate_file"):
            XdsClient(missing.xds_servers[0], missing.node)
    finally:
        plane.close()
