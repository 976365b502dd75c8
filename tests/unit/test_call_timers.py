"""The asyncio driver's call timers: a heap per channel under one asyncio timer (grpc_retry/aio/_timers.py)."""

import asyncio
import gc
import time
import weakref

from grpc_retry.aio import _timers


class Call:
    def __init__(self, log, name, on_fire=None, loop=None):
        self.log, self.name, self.on_fire = log, name, on_fire
        self._loop = loop or asyncio.get_running_loop()

    def _on_timer(self):
        self.log.append((self.name, time.monotonic()))
        if self.on_fire is not None:
            self.on_fire()


def run(coroutine):
    return asyncio.run(coroutine)


def test_timers_fire_in_time_order_and_disarmed_ones_never():
    async def main():
        timers = _timers.CallTimers()
        log = []
        last = asyncio.Event()
        now = time.monotonic()
        entries = {name: timers.arm(now + delay, Call(log, name, last.set if name == "c" else None))
                   for name, delay in (("c", 0.06), ("a", 0.02), ("off", 0.01), ("b", 0.04))}
        timers.disarm(entries["off"])
        timers.disarm(entries["off"])  # twice: nothing more
        await asyncio.wait_for(last.wait(), 10)  # the last one's time is past every other's
        assert [name for name, _ in log] == ["a", "b", "c"]
        for (_, fired), delay in zip(log, (0.02, 0.04, 0.06), strict=True):
            assert fired >= now + delay
        timers.disarm(entries["a"])  # fired already: nothing happens
        assert entries["off"][2] is None and entries["a"][2] is None  # nothing of the calls is held
    run(main())


def test_an_earlier_timer_moves_the_loops_timer_and_a_timer_armed_as_one_fires_waits_for_the_next_turn():
    async def main():
        timers = _timers.CallTimers()
        log = []
        turns = []
        seen = []  # the turns that had passed when "again" fired
        now = time.monotonic()

        again = asyncio.Event()

        def rearm():  # armed for a time already past: runs on a later loop turn, not inside this one's firing
            timers.arm(time.monotonic() - 1, Call(log, "again", lambda: (seen.extend(turns), again.set())))
            asyncio.get_running_loop().call_soon(turns.append, "turn")

        late = timers.arm(now + 0.5, Call(log, "late"))
        timers.arm(now + 0.01, Call(log, "early", rearm))
        await asyncio.wait_for(again.wait(), 10)
        assert [name for name, _ in log] == ["early", "again"]
        assert seen == ["turn"]
        timers.disarm(late)
    run(main())


def test_dead_entries_are_dropped_once_they_are_most_of_the_heap():
    async def main():
        timers = _timers.CallTimers()
        log = []
        far = time.monotonic() + 60
        live = timers.arm(far, Call(log, "live"))
        for _ in range(1000):  # e.g. backoffs called off by calls that ended
            timers.disarm(timers.arm(far, Call(log, "dead")))
        assert len(timers._heap) <= 2 * _timers._COMPACT_AT + 2
        assert live in timers._heap
        timers.disarm(live)
    run(main())


def test_close_drops_every_timer_and_the_loops():
    async def main():
        timers = _timers.CallTimers()
        log = []
        timers.arm(time.monotonic() + 0.01, Call(log, "a"))
        loop = asyncio.get_running_loop()
        assert any(not h.cancelled() for h in loop._scheduled)
        timers.close()
        assert timers._heap == [] and all(h.cancelled() for h in loop._scheduled)
        past = asyncio.Event()
        loop.call_at(loop.time() + 0.02, past.set)  # the loop's timers run in time order: "a"'s time is past then
        await asyncio.wait_for(past.wait(), 10)
        assert log == []
    run(main())


def test_a_loop_closed_with_timers_armed_goes_with_them():
    """Nothing global holds a channel's timers: a loop closed before they fire, and its calls, are collected."""
    loop = asyncio.new_event_loop()
    timers = _timers.CallTimers()
    timers.arm(time.monotonic() + 60, Call([], "never", loop=loop))
    gone = weakref.ref(loop)
    loop.close()
    del loop, timers
    gc.collect()
    assert gone() is None
