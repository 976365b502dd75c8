"""_method.HeadersWatch: which hedged unary calls' first attempts are one batch (asyncio), by the numbers."""

from __future__ import annotations

from grpc_retry._method import WATCH_EVERY, WATCH_FIRST, HeadersWatch


def test_the_first_calls_and_one_in_every_watch_every_show_their_headers_first():
    watch = HeadersWatch("/m")
    whole = [watch.first_whole() for _ in range(4 * WATCH_EVERY)]
    watched = [i + 1 for i, one_batch in enumerate(whole) if not one_batch]
    assert watched == list(range(1, WATCH_FIRST + 1)) + [
        n for n in range(WATCH_FIRST + 1, 4 * WATCH_EVERY + 1) if n % WATCH_EVERY == 0]


def test_once_headers_came_ahead_every_first_attempt_shows_them():
    watch = HeadersWatch("/m")
    for _ in range(WATCH_FIRST):
        watch.first_whole()
    assert watch.first_whole()
    watch.headers_early()
    assert not any(watch.first_whole() for _ in range(4 * WATCH_EVERY))
