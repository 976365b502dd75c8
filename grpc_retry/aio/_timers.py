"""An asyncio channel's call timers (the call machine's one timer per call: the next hedge, a backoff, a deadline
while no attempt is out): a heap, and one asyncio timer for the soonest.

Most hedged calls arm their hedging timer as they start and disarm it as their first attempt answers. asyncio
makes a TimerHandle for each and keeps it in its heap until its time (~5% of a hedged call's CPU at one call in
flight); here arming is a heap push and disarming a store, and the loop's own timer is moved only when an earlier
one comes. A disarmed entry holds nothing of its call; it is dropped when its time comes, or when the dead
outnumber the live (long backoffs, deadlines). The channel's close() drops them all and the loop's timer.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from time import monotonic
from typing import Any, List, Optional

log = logging.getLogger("grpc_retry")

Entry = List[Any]  # [when, sequence, the call (None once disarmed or fired)]

_COMPACT_AT = 64  # dead entries kept before the heap is rebuilt without them (when they are most of it)


class CallTimers:
    """A channel's (its calls' loop is the channel's: grpc.aio binds a channel to one loop)."""

    __slots__ = ("_loop", "_heap", "_seq", "_handle", "_handle_at", "_dead")

    def __init__(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the calls' (known from the first one armed)
        self._heap: List[Entry] = []
        self._seq = itertools.count()
        self._handle: Optional[asyncio.TimerHandle] = None  # the loop's timer, for the soonest entry
        self._handle_at = 0.0
        self._dead = 0  # disarmed entries still in the heap

    def arm(self, at: float, call: Any) -> Entry:
        """Call `call._on_timer()` at monotonic time `at` (on `call._loop`); disarm() the entry returned to call
        it off (nothing happens if it has fired)."""
        self._loop = call._loop
        entry = [at, next(self._seq), call]
        heapq.heappush(self._heap, entry)
        if self._handle is None or at < self._handle_at:
            self._wake_at(at)
        return entry

    def disarm(self, entry: Entry) -> None:
        if entry[2] is not None:
            entry[2] = None
            self._dead += 1
            heap = self._heap
            if self._dead > _COMPACT_AT and self._dead * 2 > len(heap):
                heap[:] = [e for e in heap if e[2] is not None]
                heapq.heapify(heap)
                self._dead = 0

    def _wake_at(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle_at = at
        loop = self._loop
        assert loop is not None  # (not typing.cast(): compiled, that is still a Python function's call)
        self._handle = loop.call_later(max(at - monotonic(), 0.0), self._fire)

    def close(self) -> None:
        """The channel closed (its calls have ended): nothing is left to fire."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._heap.clear()
        self._dead = 0

    def _fire(self) -> None:
        self._handle = None
        heap = self._heap
        now = monotonic()
        due = []
        while heap and (heap[0][0] <= now or heap[0][2] is None):
            entry = heapq.heappop(heap)
            call, entry[2] = entry[2], None
            if call is None:
                self._dead -= 1
            else:
                due.append(call)
        if heap:
            self._wake_at(heap[0][0])
        for call in due:  # (what they arm, even due now, waits for the loop's next turn, as with asyncio's timers)
            try:
                call._on_timer()
            except Exception:  # a bug: the other calls' timers still fire
                log.exception("grpc_retry timer callback failed")
