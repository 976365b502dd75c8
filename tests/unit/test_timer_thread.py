"""The sync API's timer thread (grpc_retry._timer.Timers): timers fire in due order whether they sit in the heap or
in a lane, cancelled ones never fire, and none is left counted or held once fired or cancelled."""

from __future__ import annotations

import threading
import time

from grpc_retry._timer import Timers


class Fired:
    def __init__(self, expected: int) -> None:
        self.order: list = []
        self.times: dict = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._expected = expected

    def callback(self, name: object):
        def fire() -> None:
            with self._lock:
                self.order.append(name)
                self.times[name] = time.monotonic()
                if len(self.order) == self._expected:
                    self._done.set()
        return fire

    def wait(self) -> None:
        assert self._done.wait(10), self.order


def test_lane_and_heap_timers_fire_in_due_order():
    timers = Timers()
    fired = Fired(5)
    lane = object()
    start = time.monotonic()
    timers.schedule(0.10, fired.callback("lane 0.10"), lane=lane)
    timers.schedule(0.25, fired.callback("lane 0.25"), lane=lane)
    # due before the lane's last: to the heap, and still fires in its place
    timers.schedule(0.05, fired.callback("lane 0.05"), lane=lane)
    timers.schedule(0.20, fired.callback("heap 0.20"))
    timers.schedule(0.15, fired.callback("other lane 0.15"), lane="other")
    fired.wait()
    assert fired.order == ["lane 0.05", "lane 0.10", "other lane 0.15", "heap 0.20", "lane 0.25"]
    for name, at in fired.times.items():
        due = float(str(name).split()[-1])
        assert at - start >= due - 0.005, (name, at - start)
    assert timers.pending() == 0


def test_a_timer_set_a_moment_late_in_its_lane_takes_its_place_there():
    timers = Timers()
    fired = Fired(3)
    lane = object()
    timers.schedule(0.10, fired.callback(1), lane=lane)
    timers.schedule(0.14, fired.callback(3), lane=lane)
    timers.schedule(0.12, fired.callback(2), lane=lane)  # (as another thread's call, setting its own at once)
    assert [when for when, _ in timers._lanes[lane]] == sorted(when for when, _ in timers._lanes[lane])
    assert timers._heap == []
    fired.wait()
    assert fired.order == [1, 2, 3]


def test_cancelled_lane_timers_never_fire_and_are_not_counted():
    timers = Timers()
    fired = Fired(1)
    lane = object()
    handles = [timers.schedule(0.05 + i * 0.01, fired.callback(i), lane=lane) for i in range(20)]
    last = timers.schedule(0.3, fired.callback("last"), lane=lane)
    assert timers.pending() == 21
    for handle in handles:
        handle.cancel()
        assert handle.callback is None  # what it would have called is dropped at once
    assert timers.pending() == 1
    fired.wait()
    assert fired.order == ["last"]
    assert last.callback is None and timers.pending() == 0


def test_a_lane_emptied_is_dropped_and_the_thread_ends_with_nothing_left():
    timers = Timers()
    fired = Fired(1)
    lane = object()
    timers.schedule(0.01, fired.callback("one"), lane=lane)
    fired.wait()
    thread = timers._thread
    assert thread is not None
    thread.join(5)  # it lingers a moment for the next timer, then ends
    assert not thread.is_alive()
    assert timers._lanes == {} and timers._heap == [] and timers._thread is None


def test_lane_timers_set_from_many_threads_at_once_all_fire_in_time():
    timers = Timers()
    threads_n, per_thread = 8, 50
    fired = Fired(threads_n * per_thread)
    lane = object()
    due = {}
    start = threading.Barrier(threads_n)

    def setter(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            name = (t, i)
            due[name] = time.monotonic() + 0.02 + i * 0.001
            timers.schedule(0.02 + i * 0.001, fired.callback(name), lane=lane)

    threads = [threading.Thread(target=setter, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    fired.wait()
    assert sorted(fired.order) == sorted(due)
    early = [name for name in due if fired.times[name] < due[name] - 0.005]
    assert not early
    assert timers.pending() == 0
