"""A thread of the process that runs what it is given, one function after another: started when given one, ended
when idle for a moment, started afresh in a forked child (threads do not survive a fork). The resolver runs the
process's DNS lookups on one; the sync channels' subscribe() callbacks run on another."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Callable, Deque, Optional

log = logging.getLogger("grpc_retry")


class SerialThread:
    def __init__(self, name: str, linger: float = 1.0) -> None:
        self._name = name
        self._linger = linger
        self._start_afresh()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._start_afresh)

    def _start_afresh(self) -> None:
        self._queue: Deque[Callable[[], None]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None

    def submit(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._queue.append(fn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._cond.wait(self._linger) and not self._queue:
                    self._thread = None  # under the lock: the next submit() starts a new thread
                    return
                if not self._queue:
                    continue
                fn: Optional[Callable[[], None]] = self._queue.popleft()
            try:
                fn()  # type: ignore[misc]
            except Exception:
                log.exception("grpc_retry: %s task failed", self._name)
            fn = None  # hold nothing of it while idle
