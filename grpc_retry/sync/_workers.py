"""Threads for the blocking waits a sync call cannot avoid (a hedge's first answer comes only through a blocking
read; an attempt's requests, sent one at a time from the application's iterator, where grpcio starts a thread per
call for them): one per wait in progress, reused while they last, ended when idle for a moment or when their
channel closes. Unlike a ThreadPoolExecutor, nothing is queued behind a long wait (a hedge's watcher cannot hold
up another attempt's requests), and nothing outlives the channel but a task blocked in the application's own code
(as grpcio's thread would be)."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Tuple

from grpc_retry._driver import log

# How long an idle worker waits for the next task before it ends.
IDLE = 1.0


class _Worker:
    __slots__ = ("task", "wake")

    def __init__(self, task: Optional[Tuple[Callable[..., None], Tuple[Any, ...]]]) -> None:
        self.task = task
        self.wake = threading.Event()


class Workers:
    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._idle: List[_Worker] = []
        self._closed = False

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) on an idle worker, or on a new one."""
        with self._lock:
            if self._closed:
                raise RuntimeError("workers closed")
            if self._idle:
                worker = self._idle.pop()
                worker.task = (fn, args)
                worker.wake.set()
                return
        threading.Thread(target=self._run, args=(_Worker((fn, args)),), name=self._name, daemon=True).start()

    def close(self) -> None:
        """Idle workers end now; busy ones when their task returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.wake.set()

    def _run(self, worker: _Worker) -> None:
        while True:
            fn, args = worker.task  # type: ignore[misc]
            worker.task = None
            try:
                fn(*args)
            except Exception:
                log.exception("grpc_retry worker task failed")
            fn = args = None  # hold nothing of the call while idle
            with self._lock:
                if self._closed:
                    return
                worker.wake.clear()
                self._idle.append(worker)
            worker.wake.wait(IDLE)
            with self._lock:
                if worker.task is None:  # idle too long, or closed
                    if worker in self._idle:
                        self._idle.remove(worker)
                    return
