"""The direct transport's asyncio batches: a batch on grpc.aio's Cython call run without a task or a future
(`_Batch`). While its completion is handled, the tasks that calls it ended woke (ends.EndWaiter) wait in
ends.DISPATCH, to run on that same loop turn."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, Tuple

from grpc_retry._transport import ends
from grpc_retry._transport.grpc_private import ExecuteBatchError, execute_batch

_get_running_loop = asyncio._get_running_loop
_PENDING, _COMPLETED, _FINISHED, _ABANDONED = 0, 1, 2, 3  # a batch's states
_DONE = object()  # the coroutine of a finished batch
_DISPATCH = ends.DISPATCH


class _Batch:
    """A batch started now on a grpc.aio Cython call, with no task and no asyncio future: grpcio's `execute_batch`
    coroutine, run up to its one wait, waits on this object, which it also takes for its loop. grpcio's completion
    queue hands a batch's completion to any loop but its own through `call_soon_threadsafe`, which this runs at once
    on the loop's thread. `direct`: it then tells `done` at once, where a future would have the loop run its done
    callbacks a turn later (a future, a handle and a loop turn per batch). Else it tells it a turn later, as a
    future: after the completions C-core gave with it (a response stream's reads, grpc.aio's own, which must come
    before its end). Once told, `finish()` runs
    the rest of the coroutine, which reads what the batch received into its operations."""

    __slots__ = ("_coroutine", "_loop", "_direct", "_state", "_error", "done")

    def __init__(self, call: Any, operations: Tuple[Any, ...], loop: asyncio.AbstractEventLoop,
                 direct: bool) -> None:
        self._loop = loop
        self._direct = direct
        self._state = _PENDING
        self._error: Optional[BaseException] = None
        self.done: Optional[Callable[[], None]] = None  # told once the batch completed (set later, maybe)
        self._coroutine: Any = None  # (not Optional: a cast() would be a Python call)
        coroutine = execute_batch(call, operations, self)
        coroutine.send(None)  # up to its wait (it raises ExecuteBatchError if C-core refused the batch)
        self._coroutine = coroutine

    def completed(self) -> bool:
        return self._state == _COMPLETED

    def finish(self) -> bool:
        """Finish the completed batch: False if it failed (the call's status then says how)."""
        self._state = _FINISHED
        coroutine, self._coroutine = self._coroutine, _DONE
        try:
            coroutine.send(None)
        except StopIteration:
            return True
        except ExecuteBatchError:
            return False
        raise RuntimeError("grpcio's execute_batch waited more than once")

    def abandon(self) -> None:
        """Stop waiting for it (its call was cancelled): C-core completes it later, maybe once the loop is closed,
        into nothing, as grpc.aio's batch once its task is cancelled."""
        self.done = None
        if self._state != _FINISHED:
            self._state = _ABANDONED
            self._coroutine.close()

    def _tell(self) -> None:
        done, self.done = self.done, None  # it holds the attempt, which holds this
        if done is not None:
            try:
                done()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as error:  # as the loop does with a done callback that raised
                self._loop.call_exception_handler({"message": "grpc_retry: an attempt's batch callback failed",
                                                   "exception": error})

    # What execute_batch asks of its loop ...

    def create_future(self) -> _Batch:
        return self

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if _get_running_loop() is loop:
            outer, _DISPATCH.loop = _DISPATCH.loop, loop
            try:
                callback(*args)
            finally:
                _DISPATCH.loop = outer
                if outer is None and _DISPATCH.woken:
                    _DISPATCH.wake(loop)
        elif loop.is_closed():
            # Its loop closed before C-core completed it (a call cancelled as its channel closed, say): no one waits
            # for it, and grpcio then reads completions under another loop, which must not see the closed one's
            # error. Run as abandoned, the callback only releases what grpcio holds for the batch.
            self.done = None
            self._state = _ABANDONED
            callback(*args)
        else:
            self._loop.call_soon_threadsafe(callback, *args)

    # ... and of its future.

    def cancelled(self) -> bool:
        return self._state == _ABANDONED

    def set_result(self, _: Any) -> None:
        self._state = _COMPLETED
        if self._direct:
            self._tell()
        else:
            self._loop.call_soon(self._tell)

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self.set_result(None)

    def __await__(self) -> _Batch:
        return self

    def __iter__(self) -> _Batch:
        return self

    def __next__(self) -> _Batch:
        if self._coroutine is None:  # the wait, in __init__ (`finish` then ends it)
            return self
        error, self._error = self._error, None
        if error is not None:
            raise error
        raise StopIteration
