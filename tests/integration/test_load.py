"""Under load, every call ends exactly once with the status its script calls for, and nothing outlives it:
no attempt, task, timer, thread or replay buffer. Both APIs, through the `client` fixture."""

import asyncio
import gc
import threading
import time
import weakref
from concurrent import futures

import grpc
import pytest
from support.clients import retry_options, retry_policy

from grpc_retry._timer import TIMERS

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)

METHOD = "/load.Flaky/Call"
CALLS = 10_000
BATCH = 250
SERVER_THREAD = "flaky-server"


def client_threads() -> int:
    return sum(1 for t in threading.enumerate() if not t.name.startswith(SERVER_THREAD))


class FlakyServer:
    """Call i (metadata x-call) fails its first attempt with UNAVAILABLE when i % 10 < 3 (30% of calls),
    and every attempt when i % 50 == 3 (UNAVAILABLE to the end); all others answer at once."""

    def __init__(self):
        self.attempts = 0
        self._lock = threading.Lock()
        self._seen = set()
        # Named threads, so that tests can tell the server's threads from the client's.
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix=SERVER_THREAD))
        handler = grpc.unary_unary_rpc_method_handler(self._call)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("load.Flaky",
                                                                                   {"Call": handler})])
        self.target = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def _call(self, request, context):
        i = int(dict(context.invocation_metadata())["x-call"])
        with self._lock:
            self.attempts += 1
            first = i not in self._seen
            self._seen.add(i)
        if i % 50 == 3 or (i % 10 < 3 and first):
            context.abort(grpc.StatusCode.UNAVAILABLE, "flaky")
        return request

    def stop(self):
        self._server.stop(None).wait()


def expected_code(i: int) -> grpc.StatusCode:
    return grpc.StatusCode.UNAVAILABLE if i % 50 == 3 else grpc.StatusCode.OK


def expected_attempts() -> int:
    always = sum(1 for i in range(CALLS) if i % 50 == 3)
    once = sum(1 for i in range(CALLS) if i % 10 < 3 and i % 50 != 3)
    return CALLS + once + 2 * always  # maxAttempts 3


@pytest.fixture
def flaky():
    server = FlakyServer()
    yield server
    server.stop()


def _options():
    return retry_options(retry_policy(max_attempts=3, initial="0.001s", maximum="0.005s"),
                         name=[{"service": "load.Flaky"}])


async def _aio_run(channel, ends, live):
    multicallable = channel.unary_unary(METHOD)

    async def one(i):
        call = multicallable(b"x", timeout=20, metadata=(("x-call", str(i)),))
        live.add(call)
        call.add_done_callback(lambda c, i=i: ends[i].append(c.done()))
        try:
            await call
        except grpc.aio.AioRpcError:
            pass
        return await call.code()

    codes = []
    for start in range(0, CALLS, BATCH):
        codes += await asyncio.gather(*(one(i) for i in range(start, min(start + BATCH, CALLS))))
    return codes


def _sync_run(channel, ends, live):
    multicallable = channel.unary_unary(METHOD)
    codes = []
    for start in range(0, CALLS, BATCH):
        batch = []
        for i in range(start, min(start + BATCH, CALLS)):
            future = multicallable.future(b"x", timeout=20, metadata=(("x-call", str(i)),))
            live.add(future)
            future.add_done_callback(lambda f, i=i: ends[i].append(f.done()))
            batch.append(future)
        codes += [f.code() for f in batch]
    return codes


def test_ten_thousand_calls_end_exactly_once_and_leave_nothing(client, flaky):
    ch = client.channel(flaky.target, _options())
    # One call first: it connects the subchannel (its watcher task or thread stays for the channel's life).
    assert ch.unary(METHOD, b"warm-up", metadata=(("x-call", "-1"),), timeout=20).code == grpc.StatusCode.OK
    flaky.attempts = 0
    ends = [[] for _ in range(CALLS)]
    live = weakref.WeakSet()
    threads_before = client_threads()
    gc.collect()
    objects_before = len(gc.get_objects())
    started = time.monotonic()
    if client.api == "aio":
        tasks_before = ch.run(_all_tasks())
        codes = ch.run(_aio_run(ch.channel, ends, live), timeout=300)
    else:
        codes = _sync_run(ch.channel, ends, live)
    elapsed = time.monotonic() - started

    assert codes == [expected_code(i) for i in range(CALLS)]
    # Sync done callbacks may run on grpc's threads just after code() returned.
    _wait_until(lambda: all(e for e in ends), 10)
    assert [len(e) for e in ends] == [1] * CALLS, "a call ended more or less than once"
    assert flaky.attempts == expected_attempts()

    # Nothing outlives its call.
    assert ch.state.pool.used == 0
    if client.api == "aio":
        assert ch.run(_all_tasks()) <= tasks_before
    else:
        assert TIMERS.pending() == 0
    assert client_threads() <= threads_before + 4  # grpcio's own pollers may start once
    gc.collect()
    assert len(live) == 0, f"{len(live)} calls still referenced after they ended"
    growth = len(gc.get_objects()) - objects_before
    assert growth < 20_000, f"{growth} objects more after {CALLS} calls"
    print(f"{client.api}: {CALLS} calls in {elapsed:.1f}s, object growth {growth}")


async def _all_tasks():
    return len(asyncio.all_tasks())


def test_a_thousand_calls_in_backoff_hold_no_thread_each(client, flaky):
    """1,000 calls waiting in a 30 s backoff at once: the process holds the same few threads."""
    policy = retry_policy(max_attempts=3, initial="30s", maximum="30s")
    ch = client.channel(flaky.target, retry_options(policy, name=[{"service": "load.Flaky"}]))
    ch.state.rng = lambda: 1.0  # every backoff exactly 30 s
    assert ch.unary(METHOD, b"warm-up", metadata=(("x-call", "-1"),), timeout=20).code == grpc.StatusCode.OK
    flaky.attempts = 0
    threads_before = client_threads()
    ids = [i for i in range(5000) if i % 10 < 3 and i % 50 != 3][:1000]
    if client.api == "aio":
        async def start():
            mc = ch.channel.unary_unary(METHOD)
            calls = [mc(b"x", timeout=60, metadata=(("x-call", str(i)),)) for i in ids]
            for call in calls:
                call.add_done_callback(lambda c: None)  # nobody awaits: the call must still run
            return calls

        calls = ch.run(start())
    else:
        mc = ch.channel.unary_unary(METHOD)
        calls = [mc.future(b"x", timeout=60, metadata=(("x-call", str(i)),)) for i in ids]
    # Every call has failed its first attempt and sleeps in backoff (aio: on its sleep future; sync: a timer).
    if client.api == "aio":
        def in_backoff():
            return ch.run(_count_sleeping(calls)) == len(ids)
    else:
        def in_backoff():
            return TIMERS.pending() == len(ids)
    _wait_until(in_backoff, 30)
    assert flaky.attempts == len(ids)
    in_backoff_threads = client_threads()
    print(f"{client.api}: {len(ids)} calls in backoff, client threads {threads_before} -> {in_backoff_threads}")
    assert in_backoff_threads - threads_before <= 4, (threads_before, in_backoff_threads)

    if client.api == "aio":
        ch.run(_cancel_all(calls))
    else:
        for call in calls:
            assert call.cancel()
    codes = [ch.run(c.code()) if client.api == "aio" else c.code() for c in calls]
    assert set(codes) == {grpc.StatusCode.CANCELLED}
    assert flaky.attempts == len(ids)
    if client.api == "sync":
        assert TIMERS.pending() == 0


async def _cancel_all(calls):
    for call in calls:
        assert call.cancel()


async def _count_sleeping(calls):
    return sum(1 for call in calls if call._machine.state_name == "BACKOFF")


def _wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
