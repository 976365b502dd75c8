"""One timer thread per process for the sync API's delays (backoff, hedging, grace): a heap and a condition,
so that 1,000 calls in backoff cost one thread, not 1,000. The thread runs only while timers are pending (and
a moment after, for the next): a process whose channels are closed holds none.

Timers of one lane (a blocking hedged call's hedging delay, per method) are most often due in the order they were
set, and most often cancelled: a lane is a FIFO (set and dropped at O(1), no heap). A timer due before the last ones
set in its lane (calls on other threads setting theirs at once) takes its place among them, and one due before
more than LANE_REACH of them goes to the heap instead."""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
from time import monotonic
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

log = logging.getLogger("grpc_retry")


# How far from its back a lane's timer is put in its place (further: to the heap).
LANE_REACH = 16
# How long the thread waits for a new timer once none is pending, before it ends.
LINGER = 0.05
# The longest it sleeps at once: a cancelled timer does not wake it (a hedging delay or a backoff is cancelled on
# most calls), so it finds out this late that nothing is left, and ends.
NAP = 0.2


class TimerHandle:
    __slots__ = ("callback", "cancelled", "shared")

    def __init__(self, callback: Callable[[], None], shared: bool = False) -> None:
        self.callback: Optional[Callable[[], None]] = callback
        self.cancelled = False
        self.shared = shared  # the process's, not a call's (a name's periodic lookup)

    def cancel(self) -> None:
        """Cancel it: the thread drops it when it next looks (within NAP), without being woken for it."""
        self.cancelled = True
        self.callback = None  # drop references to the call at once


class Timers:
    def __init__(self) -> None:
        self._heap: List[Tuple[float, int, TimerHandle]] = []
        self._lanes: Dict[Any, Deque[Tuple[float, TimerHandle]]] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._wakes_at = 0.0  # when the sleeping thread wakes by itself (0: it is awake, and looks before sleeping)

    def schedule(self, delay: float, callback: Callable[[], None], shared: bool = False,
                 lane: Any = None) -> TimerHandle:
        """`callback` run on the timer thread after `delay` s unless cancelled; `lane`: see the module's text."""
        handle = TimerHandle(callback, shared)
        when = monotonic() + max(delay, 0.0)
        entry = (when, handle)  # (a lane's)
        if lane is not None:
            # A lane's usual case, without the lock (which overlapping calls would queue on, each blocking a moment
            # and waking the next): due no sooner than its last timer, appended behind it. The thread, which wakes
            # by the lane's first, finds it in time. (Compiled, the look and the append are one step under the GIL:
            # nothing runs between them that could empty the lane and drop it.)
            queue = self._lanes.get(lane)
            if queue and queue[-1][0] <= when:
                queue.append(entry)
                return handle
        with self._lock:  # the condition's lock: its own `with` is Python code, run per call
            queue = None if lane is None else self._lanes.get(lane)
            if queue is not None:
                # Its place, looked for from the back: calls on other threads may have set theirs a moment later
                i = len(queue)
                while i and queue[i - 1][0] > when and len(queue) - i < LANE_REACH:
                    i -= 1
                if i and queue[i - 1][0] > when:
                    heapq.heappush(self._heap, (when, next(self._seq), handle))
                else:
                    queue.insert(i, entry)
            elif lane is not None:
                self._lanes[lane] = collections.deque((entry,))
            else:
                heapq.heappush(self._heap, (when, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="grpc_retry-timers", daemon=True)
                self._thread.start()
            elif when < self._wakes_at:  # else it is awake, or wakes before this is due anyway
                self._wakes_at = 0.0
                self._cond.notify()
        return handle

    def pending(self) -> int:
        """Timers of calls still to fire (those shared by the process's channels not counted)."""
        with self._cond:
            return (sum(1 for _, _, h in self._heap if not h.cancelled and not h.shared)
                    + sum(1 for queue in self._lanes.values() for _, h in queue if not h.cancelled and not h.shared))

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    lane = self._next_lane()
                    if not self._heap and lane is None:
                        self._wakes_at = monotonic() + LINGER
                        woken = self._cond.wait(LINGER)
                        self._wakes_at = 0.0
                        if not woken and not self._heap and not self._lanes:
                            self._thread = None  # under the lock: the next schedule() starts a new thread
                            return
                        continue
                    if lane is not None and (not self._heap or lane[0][0] < self._heap[0][0]):
                        when, handle = lane[0]
                    else:
                        lane = None
                        when, _, handle = self._heap[0]
                    now = monotonic()
                    if when <= now:
                        if lane is not None:
                            lane.popleft()
                        else:
                            heapq.heappop(self._heap)
                        break
                    wait = min(when - now, NAP)
                    self._wakes_at = now + wait
                    self._cond.wait(wait)
                    self._wakes_at = 0.0
            callback, handle.callback = handle.callback, None
            if callback is not None and not handle.cancelled:
                try:
                    callback()
                except Exception:
                    log.exception("grpc_retry timer callback failed")
            # Hold nothing of the fired call while waiting for the next timer.
            callback = None
            del handle

    def _next_lane(self) -> Optional[Deque[Tuple[float, TimerHandle]]]:
        """(Under the lock.) The lane whose first timer is due first, once each lane's cancelled ones are dropped
        from its front (and lanes left empty with them); None if no timer is in a lane."""
        first: Optional[Deque[Tuple[float, TimerHandle]]] = None
        emptied: Optional[List[Any]] = None
        for key, queue in self._lanes.items():
            while queue and queue[0][1].cancelled:
                queue.popleft()
            if not queue:
                emptied = [key] if emptied is None else emptied + [key]
            elif first is None or queue[0][0] < first[0][0]:
                first = queue
        if emptied is not None:
            for key in emptied:
                if not self._lanes[key]:  # (still: see schedule)
                    del self._lanes[key]
        return first

    def _after_fork(self) -> None:
        # The thread did not come along, and the timers were the parent's calls': start afresh.
        self._heap = []
        self._lanes = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._thread = None
        self._wakes_at = 0.0


TIMERS = Timers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=TIMERS._after_fork)
