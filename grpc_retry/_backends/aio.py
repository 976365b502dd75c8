"""asyncio subchannels: grpc.aio channels on the channel's loop, each watched by a task awaiting its state
changes (grpc.aio's completion queue wakes it: no thread, no polling). Lookups answer on the resolver thread;
their addresses are applied on the loop."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Callable, Dict, List, Optional, Set

import grpc

from grpc_retry._backends import health
from grpc_retry._backends.subchannels import RETIRE_GRACE, SHUTDOWN, Subchannels
from grpc_retry._transport import transport as internals

# How long close() waits for its subchannels' watches to see their channels closed: they do within milliseconds
# (a call still in C-core would keep its channel open there; close() has ended every call by then).
WATCHES_END = 0.05
# The loop's turns a name's first failure waits after FAILURE_NO_SOONER (grpc.aio's reaches a stream call ~20 turns
# after its answer).
FAILURE_TURNS = 20


class AioSubchannels(Subchannels):
    def __init__(self, *args: Any) -> None:
        self._tasks: List[Optional[asyncio.Task[Any]]] = []
        self._ending: Set[asyncio.Task[Any]] = set()  # watches of dropped channels, ending as those close
        self._retired: Set[Any] = set()  # channels whose address vanished, closing once their calls end
        self._health_tasks: Dict[int, asyncio.Task[None]] = {}
        weakref.finalize(self, _cancel_tasks, self._health_tasks)
        # The loop grpc.aio's own channel would bind to (made outside a coroutine too, with no deprecation
        # warning on Python 3.12+).
        self._loop: Optional[asyncio.AbstractEventLoop] = internals.aio_working_loop()
        super().__init__(*args)

    def _schedule(self, delay: float, callback: Callable[[], None]) -> Any:
        assert self._loop is not None
        return self._loop.call_later(delay, callback)  # started from the channel's first call: on its loop

    def _hold_failure(self, early: float, apply: Callable[[], None]) -> bool:
        # After FAILURE_NO_SOONER, FAILURE_TURNS turns of the loop: work a stall (a collection, a busy machine) held
        # up goes first, as on grpc.aio, whose failure reaches a call through its completion queue and the call's
        # tasks: a write just after the call began still finds it running.
        assert self._loop is not None
        loop = self._loop

        def turn(left: int) -> None:
            if left:
                loop.call_soon(turn, left - 1)
            else:
                apply()
        loop.call_later(max(early, 0.0), turn, FAILURE_TURNS)
        return True

    def _make_channel(self, address: str) -> Any:
        return internals.new_aio_channel(address, self._options, self._credentials, self._compression)

    def _closed_error(self) -> Exception:
        return grpc.aio.UsageError("Channel is closed.")

    def on_resolution(self, addresses: List[str], error: Optional[str]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._apply, addresses, error)

    def _watch(self, index: int, channel: grpc.aio.Channel, connect: bool) -> None:
        while len(self._tasks) <= index:
            self._tasks.append(None)
        self._tasks[index] = asyncio.get_running_loop().create_task(self._watch_loop(index, channel, connect))

    def _unwatch(self, index: int) -> None:
        # Not cancelled: the watch ends by itself when its channel's close reaches it. Cancelled, it would leave
        # its state watch pending in C-core until then, and grpc.aio before 1.71 hangs for good when its last
        # channel is collected while one is (it waits for its completion queue to drain).
        if index < len(self._tasks):
            task, self._tasks[index] = self._tasks[index], None
            if task is not None and not task.done():
                self._ending.add(task)
                task.add_done_callback(self._ending.discard)

    def _watch_health(self, index: int, channel: Any) -> None:
        assert self.health_service is not None
        self._health_tasks[index] = asyncio.get_running_loop().create_task(
            _health_loop(weakref.ref(self), index, channel, self.health_service))

    def _unwatch_health(self, index: int) -> None:
        task = self._health_tasks.pop(index, None)
        if task is not None:
            task.cancel()

    def _touch(self, index: int, channel: Any, connect: bool) -> None:
        if connect:
            try:
                channel.get_state(True)
            except (grpc.aio.UsageError, RuntimeError, ValueError):  # closed meanwhile
                pass

    async def _watch_loop(self, index: int, channel: grpc.aio.Channel, connect: bool) -> None:
        try:
            state = channel.get_state(connect)
            while state.value[0] != SHUTDOWN:  # closed: its watch in C-core has ended
                self.on_state(index, channel, state.value[0])
                await channel.wait_for_state_change(state)
                state = channel.get_state(False)
        except (asyncio.CancelledError, grpc.aio.UsageError, RuntimeError):
            return

    def _retire(self, index: int, channel: Any) -> None:
        self._unwatch(index)
        self._retired.add(channel)
        asyncio.get_running_loop().create_task(self._close_retired(channel))  # _apply runs on the loop

    async def _close_retired(self, channel: Any) -> None:
        try:
            await channel.close(RETIRE_GRACE)  # grpc.aio's: waits for its calls, up to the grace
        finally:
            self._retired.discard(channel)

    async def wait_change(self, timeout: Optional[float], since: Optional[int] = None, use: bool = True) -> None:
        """Wait for the next change (or one after generation `since`), or `timeout` (`use`: as when_changed)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_settle, future)

        if not self.when_changed(self.generation if since is None else since, wake, use):
            return
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self.remove_listener(wake)

    async def close(self, grace: Optional[float] = None) -> None:
        channels = self._take_all() + list(self._retired)
        for channel in channels:
            if channel is not None:
                await channel.close(grace)
        if self._ending:
            ending = set(self._ending)
            await asyncio.wait(ending, timeout=WATCHES_END)
            for task in ending:
                task.cancel()  # its channel still open in C-core (grpc.aio before 1.71 may hang when collected)
        # The attempts this cancelled finish in C-core a moment later; let their completions run on this loop
        # now, or grpc.aio hands them to a loop that may be closed by then (and drops other loops' events).
        for _ in range(3):
            await asyncio.sleep(0)
        self._notify()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _health_loop(owner: weakref.ref[AioSubchannels], index: int, channel: grpc.aio.Channel,
                       service: str) -> None:
    """A17's watch of one subchannel's backend. It holds its channel's set weakly: a channel dropped without
    close() is collected, and its finalizer cancels the watches."""

    def tell(answer: Optional[bool], unimplemented: bool = False) -> None:
        subchannels = owner()
        if subchannels is not None:
            if unimplemented:
                subchannels.unimplemented.note(subchannels.target.authority)
            subchannels.on_health(index, channel, answer)

    request, backoff = health.request(service), health.Backoff()
    watch: Any = channel.unary_stream(health.WATCH)
    try:
        while True:
            call = watch(request)
            try:
                async for response in call:
                    backoff.answered()
                    tell(health.healthy(response))
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
            finally:
                call.cancel()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                tell(health.HEALTHY, unimplemented=True)
                return
            tell(health.UNHEALTHY)
            await asyncio.sleep(backoff.delay())
    except (asyncio.CancelledError, grpc.aio.UsageError, RuntimeError):
        return


def _cancel_tasks(tasks: Dict[int, asyncio.Task[None]]) -> None:
    for task in list(tasks.values()):  # (a finalizer runs on whichever thread collects)
        loop = task.get_loop()
        if not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
