"""The core's HeadersWatch: which hedged unary calls' first attempts are one batch, by the numbers (a call's machine
sets `early`: tests/unit/test_machine_headers.py)."""

from __future__ import annotations

from grpc_retry._core import WATCH_EVERY, WATCH_FIRST, HeadersWatch


def test_the_first_calls_and_one_in_every_watch_every_show_their_headers_first():
    watch = HeadersWatch()
    whole = [watch.first_whole() for _ in range(4 * WATCH_EVERY)]
    watched = [i + 1 for i, one_batch in enumerate(whole) if not one_batch]
    assert watched == list(range(1, WATCH_FIRST + 1)) + [
        n for n in range(WATCH_FIRST + 1, 4 * WATCH_EVERY + 1) if n % WATCH_EVERY == 0]


def test_once_headers_came_ahead_every_first_attempt_shows_them():
    watch = HeadersWatch()
    for _ in range(WATCH_FIRST):
        watch.first_whole()
    assert watch.first_whole()
    watch.early = True  # (what a call's machine does as it sees headers ahead)
    assert not any(watch.first_whole() for _ in range(4 * WATCH_EVERY))


def test_a_hedged_method_samples_its_calls_as_rarely_as_its_transport_prices_headers_first():
    """A sampled call's first attempt shows its headers first: a second batch on the direct transport, a streaming
    call of grpcio's on the portable one, which samples 8 times more rarely."""
    import json

    import grpc_retry
    from grpc_retry._transport import portable, transport

    assert portable.SYNC.watch_spacing == portable.AIO.watch_spacing == 8
    spacing = transport.SYNC.watch_spacing
    every = WATCH_EVERY * spacing
    config = {"methodConfig": [{"name": [{"service": "s.S"}], "hedgingPolicy": {"maxAttempts": 2,
                                                                               "hedgingDelay": "1s"}}]}
    channel = grpc_retry.insecure_channel("127.0.0.1:1", options=[("grpc.service_config", json.dumps(config))])
    try:
        method = channel.unary_unary("/s.S/M")
        whole = [method.first_whole() for _ in range(WATCH_FIRST + 3 * every)]
    finally:
        channel.close()
    watched = [i + 1 for i, one_batch in enumerate(whole) if not one_batch]
    assert watched == list(range(1, WATCH_FIRST + 1)) + [
        n for n in range(WATCH_FIRST + 1, len(whole) + 1) if n % every == 0]
