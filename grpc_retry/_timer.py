"""One timer thread per process for the sync API's delays (backoff, hedging, grace): a heap and a condition,
so that 1,000 calls in backoff cost one thread, not 1,000. The thread runs only while timers are pending (and
a moment after, for the next): a process whose channels are closed holds none."""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from time import monotonic
from typing import Callable, List, Optional, Tuple

log = logging.getLogger("grpc_retry")


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
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._wakes_at = 0.0  # when the sleeping thread wakes by itself (0: it is awake, and looks before sleeping)

    def schedule(self, delay: float, callback: Callable[[], None], shared: bool = False) -> TimerHandle:
        handle = TimerHandle(callback, shared)
        when = monotonic() + max(delay, 0.0)
        with self._lock:  # the condition's lock: its own `with` is Python code, run per call
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
            return sum(1 for _, _, h in self._heap if not h.cancelled and not h.shared)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._wakes_at = monotonic() + LINGER
                        woken = self._cond.wait(LINGER)
                        self._wakes_at = 0.0
                        if not woken and not self._heap:
                            self._thread = None  # under the lock: the next schedule() starts a new thread
                            return
                        continue
                    when, _, handle = self._heap[0]
                    now = monotonic()
                    if when <= now:
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

    def _after_fork(self) -> None:
        # The thread did not come along, and the timers were the parent's calls': start afresh.
        self._heap = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._thread = None
        self._wakes_at = 0.0


TIMERS = Timers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=TIMERS._after_fork)
