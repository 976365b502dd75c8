"""grpc_retry.install(): channels a library builds with grpc's own constructors become grpc_retry channels when
their options carry ("grpc_retry.enable", 1), and stay grpcio's otherwise. Three real backends, listed in order
(pick_first): attempt i of a call goes to backend i while the call has not used them all."""

import asyncio
import json
import threading

import grpc
import grpc.aio
import pytest
from support.backend import UNARY, Step, fail
from support.clients import ECHO_SERVICE

import grpc_retry
import grpc_retry.aio
from grpc_retry import _install

ENABLE = ("grpc_retry.enable", 1)


def retry_config() -> str:
    policy = {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
              "retryableStatusCodes": ["UNAVAILABLE"]}
    return json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "retryPolicy": policy}]})


def hedging_config() -> str:
    policy = {"maxAttempts": 3, "hedgingDelay": "0.2s", "nonFatalStatusCodes": ["UNAVAILABLE"]}
    return json.dumps({"methodConfig": [{"name": [{"service": ECHO_SERVICE}], "hedgingPolicy": policy}]})


# -- a library's channel factories: grpc's constructors only, options as its caller gives them ----------------


def library_channel(backends, config: str, *extra):
    target = "ipv4:" + ",".join(b.target for b in backends)
    return grpc.insecure_channel(target, options=[("grpc.service_config", config), *extra])


def library_aio_channel(backends, config: str, *extra):
    target = "ipv4:" + ",".join(b.target for b in backends)
    return grpc.aio.insecure_channel(target, [("grpc.service_config", config), *extra])  # options by position


def seen(backends):
    return [len(b.attempts_of(UNARY)) for b in backends]


@pytest.fixture
def installed():
    grpc_retry.install()
    yield
    grpc_retry.uninstall()


def test_the_option_makes_a_library_channel_retry_on_an_unused_backend(installed, backends):
    backends[0].script(UNARY, fail())
    with library_channel(backends, retry_config(), ENABLE) as channel:
        assert isinstance(channel, grpc_retry.Channel)
        assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen(backends) == [1, 1, 0]
    assert backends[1].attempts_of(UNARY)[0].previous == "1"


def test_without_the_option_the_same_factory_gives_grpcio_channels(installed, backends):
    backends[0].script(UNARY, fail())
    with library_channel(backends, retry_config()) as channel:
        assert type(channel) is grpc._channel.Channel
        assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen(backends) == [2, 0, 0]  # grpcio's own retry, on the backend it is connected to


def test_the_option_makes_a_library_channel_hedge(installed, backends):
    backends[0].script(UNARY, Step(wait=0))  # never answers: held until cancelled
    with library_channel(backends, hedging_config(), ENABLE) as channel:
        assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen(backends) == [1, 1, 0]
    (slow,) = backends[0].wait_ended(UNARY, 1)
    assert slow.cancelled


async def test_aio_the_option_makes_a_library_channel_retry_and_hedge(installed, backends):
    backends[0].script(UNARY, fail())
    async with library_aio_channel(backends, retry_config(), ENABLE) as channel:
        assert isinstance(channel, grpc_retry.aio.Channel)
        assert await channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen(backends) == [1, 1, 0]
    backends[0].script(UNARY, Step(wait=0))
    async with library_aio_channel(backends, hedging_config(), ENABLE) as channel:
        assert await channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen(backends) == [2, 2, 0]


async def test_aio_without_the_option_the_same_factory_gives_grpcio_channels(installed, backends):
    backends[0].script(UNARY, fail())
    async with library_aio_channel(backends, retry_config()) as channel:
        assert not isinstance(channel, grpc_retry.aio.Channel)
        assert await channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    assert seen(backends) == [2, 0, 0]


def test_all_channels_and_enable_retries_zero(backends):
    grpc_retry.install(all_channels=True)
    try:
        backends[0].script(UNARY, fail())
        with library_channel(backends, retry_config()) as channel:
            assert isinstance(channel, grpc_retry.Channel)
            assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
        assert seen(backends) == [1, 1, 0]
        # ("grpc.enable_retries", 0) still turns retries off
        backends[0].script(UNARY, fail())
        with library_channel(backends, retry_config(), ("grpc.enable_retries", 0)) as channel:
            with pytest.raises(grpc.RpcError) as failure:
                channel.unary_unary(UNARY)(b"x", timeout=10)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert seen(backends) == [2, 1, 0]
    finally:
        grpc_retry.uninstall()


def test_install_is_idempotent_and_uninstall_restores_grpcio():
    originals = (grpc.insecure_channel, grpc.secure_channel, grpc.aio.insecure_channel, grpc.aio.secure_channel)
    grpc_retry.uninstall()  # when not installed: nothing
    grpc_retry.install()
    patched = (grpc.insecure_channel, grpc.secure_channel, grpc.aio.insecure_channel, grpc.aio.secure_channel)
    grpc_retry.install()
    assert (grpc.insecure_channel, grpc.secure_channel, grpc.aio.insecure_channel,
            grpc.aio.secure_channel) == patched
    assert all(p is not o and p.__wrapped__ is o for p, o in zip(patched, originals, strict=True))
    grpc_retry.uninstall()
    grpc_retry.uninstall()
    assert (grpc.insecure_channel, grpc.secure_channel, grpc.aio.insecure_channel,
            grpc.aio.secure_channel) == originals


def test_install_and_uninstall_from_many_threads_end_consistent():
    originals = (grpc.insecure_channel, grpc.aio.secure_channel)
    start = threading.Barrier(8)

    def flip(i):
        start.wait()
        for _ in range(200):
            grpc_retry.install(all_channels=bool(i % 2))
            grpc_retry.uninstall()

    threads = [threading.Thread(target=flip, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (grpc.insecure_channel, grpc.aio.secure_channel) == originals
    assert _install._all_channels is None


async def test_subchannels_are_grpcio_channels_even_when_every_channel_is_ours(backends):
    grpc_retry.install(all_channels=True)
    try:
        async with grpc.aio.insecure_channel(backends[0].target) as channel:
            assert isinstance(channel, grpc_retry.aio.Channel)
            assert await asyncio.wait_for(channel.unary_unary(UNARY)(b"x"), 10) == b"x"
        with grpc.secure_channel(backends[0].target, grpc.local_channel_credentials()) as channel:
            assert isinstance(channel, grpc_retry.Channel)
            assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
    finally:
        grpc_retry.uninstall()


def _instrument(made: list):
    """What an instrumentation does (OpenTelemetry's, Sentry's): wrap the constructors installed now."""
    wrapped = {}
    for module in (grpc, grpc.aio):
        for name in ("insecure_channel", "secure_channel"):
            inner = getattr(module, name)

            def constructor(*args, _inner=inner, _name=f"{module.__name__}.{name}", **kwargs):
                made.append(_name)
                return _inner(*args, **kwargs)

            wrapped[(module, name)] = constructor
            setattr(module, name, constructor)
    return wrapped


def _restore(saved):
    for (module, name), constructor in saved.items():
        setattr(module, name, constructor)


def test_install_wraps_an_instrumentation_installed_before_and_uninstall_puts_it_back(backends):
    saved = {(m, n): getattr(m, n) for m in (grpc, grpc.aio) for n in ("insecure_channel", "secure_channel")}
    made: list = []
    try:
        instrumented = _instrument(made)
        grpc_retry.install()
        with grpc.insecure_channel(backends[0].target) as channel:  # not ours: made by the instrumentation
            assert not isinstance(channel, grpc_retry.Channel)
            assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
        assert made == ["grpc.insecure_channel"]
        with grpc.insecure_channel(backends[0].target, options=[ENABLE]) as channel:
            assert isinstance(channel, grpc_retry.Channel)
            assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
        grpc_retry.uninstall()
        assert {k: getattr(*k) for k in instrumented} == instrumented
    finally:
        grpc_retry.uninstall()
        _restore(saved)


def test_an_instrumentation_installed_after_install_keeps_working_past_uninstall(backends):
    saved = {(m, n): getattr(m, n) for m in (grpc, grpc.aio) for n in ("insecure_channel", "secure_channel")}
    made: list = []
    try:
        grpc_retry.install()
        instrumented = _instrument(made)
        with grpc.insecure_channel(backends[0].target, options=[ENABLE]) as channel:
            assert isinstance(channel, grpc_retry.Channel)  # through the instrumentation, then ours
        grpc_retry.uninstall()
        assert {k: getattr(*k) for k in instrumented} == instrumented  # theirs stays; ours only passes through
        with grpc.insecure_channel(backends[0].target, options=[ENABLE]) as channel:
            assert not isinstance(channel, grpc_retry.Channel)
            assert channel.unary_unary(UNARY)(b"x", timeout=10) == b"x"
        assert made == ["grpc.insecure_channel"] * 2
    finally:
        grpc_retry.uninstall()
        _restore(saved)
