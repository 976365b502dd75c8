"""Targets grpc_retry does not resolve itself go whole to one grpcio channel, as grpcio would take them: schemes
only grpcio's core resolves (xds: without the `xds` extra, google-c2p:), and any target grpcio would reach through
an HTTP CONNECT proxy (the proxy must see the name, not an address grpc_retry resolved). Retries stay
grpc_retry's. grpcio beside."""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import grpc.aio
import pytest
from support.backend import UNARY, fail
from support.clients import retry_policy, service_config
from support.connect_proxy import ConnectProxy

import grpc_retry
import grpc_retry.aio

HIDDEN = "only-the-proxy.test"  # a name no resolver but the proxy's knows


@pytest.fixture(autouse=True)
def without_the_xds_extra(monkeypatch):
    """As in a process without `grpc_retry[xds]`: its envoy protos cannot be imported."""
    monkeypatch.setitem(sys.modules, "envoy", None)


def call_sync(make, target, options):
    with make(target, options=options) as channel:
        try:
            return channel.unary_unary(UNARY)(b"x", timeout=10)
        except grpc.RpcError as error:
            return error.code()


def call_aio(make, target, options):
    async def run():
        async with make(target, options=options) as channel:
            try:
                return await channel.unary_unary(UNARY)(b"x", timeout=10)
            except grpc.RpcError as error:
                return error.code()
    return asyncio.run(run())


PAIRS = [("sync", grpc.insecure_channel, grpc_retry.insecure_channel, call_sync),
         ("aio", grpc.aio.insecure_channel, grpc_retry.aio.insecure_channel, call_aio)]


@pytest.mark.parametrize("api, theirs, ours, call", PAIRS, ids=[p[0] for p in PAIRS])
@pytest.mark.parametrize("target", ["xds:///svc.test:443", "google-c2p:///svc.test"])
def test_schemes_only_grpcio_resolves_are_taken_and_fail_as_on_grpcio(api, theirs, ours, call, target):
    assert call(ours, target, []) == call(theirs, target, []) == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def proxy(backend):
    proxy = ConnectProxy({HIDDEN: "127.0.0.1"})
    yield proxy
    proxy.close()


@pytest.mark.parametrize("api, theirs, ours, call", PAIRS, ids=[p[0] for p in PAIRS])
def test_a_proxy_sees_the_name_and_retries_stay_ours(api, theirs, ours, call, proxy, backend):
    target = f"{HIDDEN}:{backend.port}"
    options = [("grpc.http_proxy", proxy.url)]
    assert call(theirs, target, options) == b"x"
    assert proxy.connects == [target]
    backend.script(UNARY, fail())  # one failure: grpc_retry's retry policy answers it
    config = [("grpc.service_config", service_config(retry_policy(max_attempts=2)))]
    assert call(ours, target, options + config) == b"x"
    assert proxy.connects[-1] == target  # CONNECT by name: grpc_retry did not resolve it
    assert len(backend.attempts_of(UNARY)) == 3


@pytest.mark.parametrize("api, theirs, ours, call", PAIRS, ids=[p[0] for p in PAIRS])
def test_proxy_from_the_environment_and_no_proxy(api, theirs, ours, call, proxy, backend, monkeypatch):
    monkeypatch.setenv("grpc_proxy", proxy.url)
    target = f"{HIDDEN}:{backend.port}"
    # (A name only the proxy knows: answered, both went through it. Ours may share the connection grpcio's made:
    # with C-core's retries on, its channel's arguments are grpcio's, and grpcio pools subchannels.)
    assert call(theirs, target, []) == call(ours, target, []) == b"x"
    assert proxy.connects and set(proxy.connects) == {target}
    through = len(proxy.connects)
    direct = f"127.0.0.1:{backend.port}"
    monkeypatch.setenv("no_grpc_proxy", "localhost,127.0.0.0/8")
    assert call(theirs, direct, []) == call(ours, direct, []) == b"x"
    assert len(proxy.connects) == through  # exempt: neither went through the proxy
    off = [("grpc.enable_http_proxy", 0)]
    monkeypatch.delenv("no_grpc_proxy")
    assert call(theirs, direct, off) == call(ours, direct, off) == b"x"
    assert len(proxy.connects) == through


def test_the_config_is_still_grpc_retrys_on_a_whole_target():
    with pytest.raises(ValueError):
        grpc_retry.insecure_channel("xds:///svc.test", options=[("grpc.service_config", json.dumps(
            {"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1}}]}))])


@pytest.mark.parametrize("options, c_core_retries", [
    ([], True),
    ([("grpc.service_config", json.dumps({"methodConfig": [{"name": [{}], "timeout": "5s"}]}))], True),
    ([("grpc.service_config", service_config(retry_policy(max_attempts=2)))], False),
    ([("grpc.service_config", json.dumps({"methodConfig": [{"name": [{"service": "s"}], "hedgingPolicy": {
        "maxAttempts": 2, "hedgingDelay": "1s"}}]}))], False),
    ([("grpc.enable_retries", 0)], False),
], ids=["no-config", "no-policy", "retry-policy", "hedging-policy", "retries-off"])
@pytest.mark.parametrize("api", ["sync", "aio"])
def test_a_whole_target_keeps_grpcios_retries_unless_grpc_retry_has_a_policy(api, options, c_core_retries):
    """A target grpcio resolves (xds:) may have its resolver configure retries (an xDS route's, gRFC A44): they
    stay on in its grpcio channel while grpc_retry's channel has no retry or hedging policy of its own, and are off
    when it has one (one layer retries, never two) or when retries are off on the channel."""

    def check(channel):
        given = dict(channel._subchannels._options)
        assert ("grpc.enable_retries" not in given) is c_core_retries, given
        assert given.get("grpc.enable_retries", 0) == 0

    if api == "sync":
        with grpc_retry.insecure_channel("xds:///svc.test", options=options) as channel:
            check(channel)
        return

    async def run():
        async with grpc_retry.aio.insecure_channel("xds:///svc.test", options=options) as channel:
            check(channel)

    asyncio.run(run())
