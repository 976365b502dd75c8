"""threading.Condition's wait() and notify_all() over a plain lock, compiled: the sync driver waits and wakes on
every call (an attempt started, a message came, the call ended), and threading's Condition and Event are Python
code, a dozen interpreted calls per wait or wake."""

from __future__ import annotations

from _thread import allocate_lock
from typing import Any, List, Optional


class Waiters:
    """Threads waiting, under `lock`, for a change that another thread makes under it: each waits on a lock of
    its own, which notify_all() releases."""

    __slots__ = ("_lock", "_waiting")

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._waiting: Optional[List[Any]] = None

    def wait(self, timeout: Optional[float] = None) -> bool:
        """(Under the lock, which it releases while it waits.) Until notify_all() or `timeout` seconds: whether
        it was notified."""
        waiter = allocate_lock()
        waiter.acquire()
        waiting = self._waiting
        if waiting is None:
            self._waiting = waiting = []
        waiting.append(waiter)
        self._lock.release()
        notified = False
        try:
            notified = waiter.acquire() if timeout is None else waiter.acquire(True, max(timeout, 0.0))
        finally:
            self._lock.acquire()
            if not notified and self._waiting is waiting and waiter in waiting:
                waiting.remove(waiter)
        return notified

    def notify_all(self) -> None:
        """(Under the lock.)"""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            for waiter in waiting:
                waiter.release()
