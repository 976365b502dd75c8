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
