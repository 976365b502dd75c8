"""The direct transport's asyncio batches: a batch on grpc.aio's Cython call run without a task or a future
(`_Batch`), and what a task awaiting a call's end waits on (`EndWaiter`), which wakes it on the loop turn the
batch's completion is handled."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Callable, List, Optional, Tuple

from grpc_retry._grpc_internals import ExecuteBatchError, execute_batch

_get_running_loop = asyncio._get_running_loop
_current_task = asyncio.current_task
_PENDING, _COMPLETED, _FINISHED, _ABANDONED = 0, 1, 2, 3  # a batch's states
_DONE = object()  # the coroutine of a finished batch


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


class _Dispatch:
    """A `_Batch`'s completion being handed on from grpcio (its loop, None between), and the tasks that calls it
    ended woke meanwhile (`EndWaiter`): they run as soon as it has been handled, on the same loop turn. (grpcio
    reads its completion queue on one loop's thread: one completion is handed on at a time.)"""

    __slots__ = ("loop", "woken")

    def __init__(self) -> None:
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.woken: List[EndWaiter] = []

    def wake(self, loop: asyncio.AbstractEventLoop) -> None:
        woken, self.woken = self.woken, []
        i, n = 0, len(woken)
        try:
            if _current_task(loop) is None:  # (else handed on inside a task, not grpcio's own way)
                while i < n:
                    waiter = woken[i]
                    i += 1
                    waiter._run()
        finally:  # the rest (all, inside a task; after a SystemExit or KeyboardInterrupt) a loop turn later
            while i < n:
                waiter = woken[i]
                i += 1
                waiter._run_soon()


_DISPATCH = _Dispatch()
_WAITING, _ENDED, _CANCELLED = 0, 1, 2  # an EndWaiter's states


class EndWaiter:
    """What a task awaiting an asyncio call's end waits on, in place of an asyncio future: the end wakes the task
    at once when a batch's completion ended the call (`_Batch`), as soon as that completion has been handled (its
    done callbacks run), where a future would have the loop run the task's wakeup a loop turn later (a handle and
    a turn per call). Otherwise (a cancel, a timer, a read) as a future: through the loop, a turn later. It is what
    asyncio's Task asks of a future it awaits (`_asyncio_future_blocking`, as asyncio.isfuture() reads it)."""

    __slots__ = ("_loop", "_state", "_callbacks", "_cancel_message", "_asyncio_future_blocking")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._state = _WAITING
        self._callbacks: Optional[List[Tuple[Callable[[Any], Any], contextvars.Context]]] = None
        self._cancel_message: Any = None
        self._asyncio_future_blocking = False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._state != _WAITING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> None:
        if self._state == _CANCELLED:
            raise asyncio.CancelledError() if self._cancel_message is None else asyncio.CancelledError(
                self._cancel_message)
        if self._state == _WAITING:
            raise asyncio.InvalidStateError("Result is not ready.")
        return None

    def exception(self) -> Optional[BaseException]:
        self.result()
        return None

    def add_done_callback(self, fn: Callable[[Any], Any], *, context: Optional[contextvars.Context] = None) -> None:
        if context is None:
            context = contextvars.copy_context()
        if self._state != _WAITING:
            self._loop.call_soon(fn, self, context=context)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append((fn, context))

    def remove_done_callback(self, fn: Callable[[Any], Any]) -> int:
        callbacks = self._callbacks
        if not callbacks:
            return 0
        kept = [(f, c) for f, c in callbacks if f != fn]
        self._callbacks = kept
        return len(callbacks) - len(kept)

    def set_result(self, _: Any) -> None:
        if self._state != _WAITING:
            raise asyncio.InvalidStateError("invalid state")
        self._state = _ENDED
        if self._callbacks is not None:
            if _DISPATCH.loop is self._loop:
                _DISPATCH.woken.append(self)
            else:
                self._run_soon()

    def cancel(self, msg: Any = None) -> bool:
        if self._state != _WAITING:
            return False
        self._state = _CANCELLED
        self._cancel_message = msg
        self._run_soon()
        return True

    def _run_soon(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn, context in callbacks:
                self._loop.call_soon(fn, self, context=context)

    def _run(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn, context in callbacks:  # (as the loop runs a handle)
                try:
                    context.run(fn, self)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as error:
                    self._loop.call_exception_handler({"message": "grpc_retry: a call's waiter failed",
                                                       "exception": error})

    def __await__(self) -> Any:
        if self._state == _WAITING:
            self._asyncio_future_blocking = True
            yield self
        if self._state == _WAITING:
            raise RuntimeError("await wasn't used with future")
        return self.result()

    def __iter__(self) -> Any:
        return self.__await__()
