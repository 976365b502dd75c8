"""Chaos soak: does every call end exactly once, on time, leaving nothing behind, whatever the servers do?

Three backends in processes of their own are killed (SIGKILL) and restarted on the same port every second or
two; a raw HTTP/2 peer (h2) on a fourth address refuses streams, sends GOAWAY, resets or stalls them (one peer
per client, so that what is left open on it is that client's). Four clients, each in a process of its own, call
all four addresses (round_robin) side by side for `--seconds`:
plain grpc.aio, grpc_retry.aio, plain grpc (sync) and grpc_retry (sync), with the same service config (hedging
for unary and bidi calls, retries for the others, a server stream's attempts timed by perAttemptRecvTimeout; grpcio
ignores the hedging and the per-attempt timeout). Each makes unary, server-,
client- and bidi-streaming calls, cancels some of them (asyncio: half of those by cancelling the task that awaits,
reads or writes the call) and gives a third of them a 5-200 ms deadline.

Per client it prints one JSON line: calls, success rate, status histogram; calls never ended, ended twice, ended
later than their deadline + 1 s (the first few of them, with their kind and times); attempts still running on a
server (or a stream left open on the peer) after their call ended; threads, fds, tasks and live call objects before,
at the end and 5 s later; an asyncio client's loop lag (on two shared cores, tens of ms at the median and hundreds
at the top: each loop turn a call's end waits for adds it); workers that died, and of what. With `--check` it exits
1 if a grpc_retry client has a call never ended, ended twice or late, a hung worker or one that a call raised out
of, an orphan attempt, a call that ran on after the task using it was cancelled, an error left to the event loop (a
future's exception never retrieved), or a leak.

With `--deploy` it runs a deployment soak instead: rolling deploys with surge behind a real DNS server on loopback,
every client in a process of its own through the same `dns://` target; `--check` fails on any failed call of a
grpc_retry client (grpcio, which looks its name up again only on a lost connection and at most every 30 s, fails
calls there).

Usage: python bench/soak.py [--seconds 30] [--check] [--deploy]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import multiprocessing
import os
import queue
import random
import re
import signal
import socket
import sys
import threading
import time
from concurrent import futures
from typing import Any, Dict, List, Optional

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICE = "soak.Echo"
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
METHODS = {"unary_unary": "Unary", "unary_stream": "ServerStream", "stream_unary": "ClientStream",
           "stream_stream": "Bidi"}
CLIENTS = ("grpc.aio", "grpc_retry.aio", "grpc", "grpc_retry")
ORPHAN_AFTER = 1.0  # an attempt that ends this long after its call ended outlived it
LATE_AFTER = 1.0    # a call that ends this long after its deadline hung
REPORT_WITHIN = 60.0  # a client reports this long after its calls stopped (it waits 10 s + 5 s itself), or hung


def _policy(kind: str) -> dict:
    return {"name": [{"service": SERVICE, "method": METHODS[kind]}],
            **({"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s",
                                  "nonFatalStatusCodes": ["UNAVAILABLE"]}}
               if kind in ("unary_unary", "stream_stream") else
               {"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                                "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
                                # A held attempt (100-300 ms) may be cut and retried by grpc_retry's clients. (Not a
                                # client stream's: its timer runs while its requests go out, as C-core's does.)
                                **({"perAttemptRecvTimeout": "0.25s"} if kind == "unary_stream" else {})}})}


SERVICE_CONFIG = json.dumps({"methodConfig": [_policy(kind) for kind in KINDS],
                             "loadBalancingConfig": [{"round_robin": {}}]})


# -- backends ------------------------------------------------------------------------------------------------------


def _backend(port: int, ready) -> None:
    """One backend process: echoes, failing 10% of attempts UNAVAILABLE and holding 10% for 100-300 ms; records
    every attempt (call id, start, end) for the orphan count. An attempt's end is when grpc says it is over,
    cancelled or not; a held attempt lets go as soon as it is."""
    attempts: List[list] = []
    lock = threading.Lock()

    def begin(call_id: bytes, context) -> threading.Event:
        record = [call_id.decode(), time.monotonic(), None]
        over = threading.Event()

        def ended():
            record[2] = time.monotonic()
            over.set()

        with lock:
            attempts.append(record)
        if not context.add_callback(ended):
            ended()
        return over

    def behave(over: threading.Event, context) -> None:
        draw = random.random()
        if draw < 0.10:
            context.abort(grpc.StatusCode.UNAVAILABLE, "soak: unavailable")
        over.wait(random.uniform(0.1, 0.3) if draw < 0.20 else random.uniform(0, 0.005))

    def unary(request, context):
        behave(begin(request, context), context)
        return request

    def server_stream(request, context):
        over = begin(request, context)
        behave(over, context)
        for i in range(3):
            yield request + b"#%d" % i

    def client_stream(requests, context):
        first = next(requests)
        behave(begin(first, context), context)
        return b"|".join([first, *requests])

    def bidi(requests, context):
        over = None
        for request in requests:
            if over is None:
                over = begin(request, context)
                behave(over, context)
            yield request

    def report(request, context):
        with lock:
            return json.dumps(attempts).encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128),
                         options=[("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Report": grpc.unary_unary_rpc_method_handler(report),
    })])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    ready.put(port)
    server.wait_for_termination()


class Backends:
    """Three backend processes on fixed ports, and the chaos that kills and restarts them."""

    def __init__(self, context):
        self._context = context
        self._ready = context.Queue()
        self.ports = [_free_port() for _ in range(3)]
        self._processes: List[Any] = [None] * 3
        for index in range(3):
            self._start(index)
        self.kills = 0
        self._stop = threading.Event()
        self._chaos = threading.Thread(target=self._run_chaos, name="chaos", daemon=True)

    def _start(self, index: int) -> None:
        process = self._context.Process(target=_backend, args=(self.ports[index], self._ready), daemon=True)
        process.start()
        self._processes[index] = process
        self._ready.get(timeout=60)

    def start_chaos(self) -> None:
        self._chaos.start()

    def _run_chaos(self) -> None:
        rng = random.Random(7)
        while not self._stop.wait(rng.uniform(1.0, 2.0)):
            index = rng.randrange(3)
            os.kill(self._processes[index].pid, signal.SIGKILL)
            self._processes[index].join()
            self.kills += 1
            if self._stop.wait(rng.uniform(0.2, 1.0)):
                self._start(index)
                return
            self._start(index)

    def stop_chaos(self) -> None:
        self._stop.set()
        self._chaos.join()

    def reports(self) -> List[list]:
        """Every attempt the live backends saw: [call id, start, end or None]."""
        seen: List[list] = []
        for port in self.ports:
            with grpc.insecure_channel(f"127.0.0.1:{port}",
                                       options=[("grpc.max_receive_message_length", -1)]) as channel:
                seen += json.loads(channel.unary_unary(f"/{SERVICE}/Report")(b"", timeout=30))
        return seen

    def stop(self) -> None:
        for process in self._processes:
            process.kill()
            process.join()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- clients -------------------------------------------------------------------------------------------------------


class Ledger:
    """What happened to each call: when it began, its deadline, each time it was reported ended, its status."""

    def __init__(self, name: str):
        self.name = name
        self._next = 0
        self.calls: Dict[str, list] = {}  # id -> [start, timeout, [end times], code, kind]
        self.lock = threading.Lock()

    def begin(self, timeout: float, kind: str) -> str:
        with self.lock:
            self._next += 1
            call_id = f"{self.name}:{self._next}"
            self.calls[call_id] = [time.monotonic(), timeout, [], None, kind]
        return call_id

    def ended(self, call_id: str, code: Optional[grpc.StatusCode]) -> None:
        now = time.monotonic()
        with self.lock:
            record = self.calls[call_id]
            record[2].append(now)
            if code is not None:
                record[3] = code.name


def _plan(rng: random.Random, channel: Any, ledger: Ledger):
    """The next call: its id, kind, multicallable, request, timeout, and when (if at all) the client cancels it."""
    kind = rng.choice(KINDS)
    timeout = rng.uniform(0.005, 0.2) if rng.random() < 0.33 else 2.0
    cancel_after = rng.uniform(0, 0.05) if rng.random() < 0.1 else None
    call_id = ledger.begin(timeout, kind)
    payload = call_id.encode()
    request = payload if kind.startswith("unary") else iter([payload, b"more"])
    return call_id, kind, getattr(channel, kind)(f"/{SERVICE}/{METHODS[kind]}"), request, timeout, cancel_after


def _resources(tasks: Optional[int] = None) -> dict:
    gc.collect()
    kinds = ("grpc_retry.", "grpc._channel", "grpc.aio._call", "grpc._cython")
    calls = sum(1 for o in gc.get_objects() if str(getattr(type(o), "__module__", "")).startswith(kinds) and
                hasattr(o, "cancel") and hasattr(o, "code"))
    return {"threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd")), "tasks": tasks,
            "call_objects": calls, "objects": len(gc.get_objects())}


def _make_channel(client: str, target: str):
    options = [("grpc.service_config", SERVICE_CONFIG)]
    if client == "grpc.aio":
        return grpc.aio.insecure_channel(target, options=options)
    if client == "grpc":
        return grpc.insecure_channel(target, options=options)
    import grpc_retry
    import grpc_retry.aio
    return (grpc_retry.aio if client.endswith(".aio") else grpc_retry).insecure_channel(target, options=options)


async def _aio_client(client: str, target: str, seconds: float, concurrency: int, ledger: Ledger) -> dict:
    warm = _make_channel(client, target)  # grpc.aio's process-wide threads start here, before the baseline
    await warm.channel_ready()
    await warm.close()
    await asyncio.sleep(0.5)
    before = _resources(len(asyncio.all_tasks()) - 1)
    channel = _make_channel(client, target)
    stop_at = time.monotonic() + seconds
    unhandled = []  # errors reported to the loop: a future's exception never retrieved, a callback that raised

    def on_error(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        unhandled.append(context.get("message"))
        loop.default_exception_handler(context)

    asyncio.get_running_loop().set_exception_handler(on_error)

    left_running = 0  # calls that ran on after the task awaiting, reading or writing them was cancelled

    async def use(call: Any, kind: str, writes: Optional[List[bytes]]) -> None:
        if writes is not None:  # a request stream written by this task, not read from an iterator
            for message in writes:
                await call.write(message)
            await call.done_writing()
        if kind.endswith("stream"):
            async for _ in call:
                pass
        else:
            await call

    async def worker(seed: int) -> None:
        nonlocal left_running
        rng = random.Random(seed)
        while time.monotonic() < stop_at:
            call_id, kind, multicallable, request, timeout, cancel_after = _plan(rng, channel, ledger)
            # Half the calls cancelled are cancelled through the task using them: that must cancel the RPC too.
            cancel_task = cancel_after is not None and rng.random() < 0.5
            writes = list(request) if cancel_task and kind.startswith("stream") else None
            call = multicallable(None if writes is not None else request, timeout=timeout)
            call.add_done_callback(lambda c, i=call_id: ledger.ended(i, None))
            try:
                if cancel_task:
                    user = asyncio.ensure_future(use(call, kind, writes))
                    await asyncio.wait((user,), timeout=cancel_after)
                    if user.cancel():
                        await asyncio.wait((user,))
                        if user.cancelled() and not call.done():
                            left_running += 1
                    await user
                else:
                    if cancel_after is not None:
                        await asyncio.sleep(cancel_after)
                        call.cancel()
                    await use(call, kind, None)
            except (grpc.RpcError, asyncio.CancelledError, asyncio.InvalidStateError):
                pass
            code = await call.code()
            with ledger.lock:
                ledger.calls[call_id][3] = code.name

    lags: List[float] = []  # how late a 10 ms sleep wakes: the loop's lag, which every call's end waits behind

    async def lag_monitor() -> None:
        while time.monotonic() < stop_at:
            start = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - start - 0.01)

    monitor = asyncio.ensure_future(lag_monitor())
    workers = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    done, pending = await asyncio.wait(workers, timeout=seconds + 10)
    hung = len(pending)
    died = collections.Counter("cancelled" if task.cancelled() else _error(task.exception()) for task in done
                               if task.cancelled() or task.exception() is not None)
    await monitor
    lags.sort()
    lag = {"p50": round(lags[len(lags) // 2] * 1e3, 1), "p99": round(lags[len(lags) * 99 // 100] * 1e3, 1),
           "max": round(lags[-1] * 1e3, 1)} if lags else {}
    for task in pending:
        task.cancel()
    end = _resources(len(asyncio.all_tasks()) - 1 - len(pending))
    await channel.close()
    await asyncio.sleep(5)
    later = _resources(len(asyncio.all_tasks()) - 1 - len(pending))
    gc.collect()  # (a future's unretrieved exception is reported as it is collected)
    return {"hung_workers": hung, "worker_errors": dict(died), "before": before, "end": end, "later": later,
            "task_cancel_left_call_running": left_running, "loop_errors": len(unhandled), "loop_lag_ms": lag}


def _sync_client(client: str, target: str, seconds: float, concurrency: int, ledger: Ledger) -> dict:
    warm = _make_channel(client, target)
    grpc.channel_ready_future(warm).result(timeout=10)
    warm.close()
    time.sleep(0.5)
    before = _resources()
    channel = _make_channel(client, target)
    stop_at = time.monotonic() + seconds

    died: collections.Counter = collections.Counter()

    def worker(seed: int) -> None:
        try:
            calls(seed)
        except BaseException as error:  # a worker that a call raised out of: what it raised is reported
            died[_error(error)] += 1

    def calls(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop_at:
            call_id, kind, multicallable, request, timeout, cancel_after = _plan(rng, channel, ledger)
            call = multicallable(request, timeout=timeout) if kind.endswith("stream") else \
                multicallable.future(request, timeout=timeout)
            call.add_done_callback(lambda c, i=call_id: ledger.ended(i, None))
            if cancel_after is not None:
                time.sleep(cancel_after)
                call.cancel()
            try:
                if kind.endswith("stream"):
                    for _ in call:
                        pass
                else:
                    call.result()
            except (grpc.RpcError, grpc.FutureCancelledError):
                pass
            with ledger.lock:
                ledger.calls[call_id][3] = call.code().name

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds + 10
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = sum(1 for thread in threads if thread.is_alive())
    end = _resources()
    channel.close()
    time.sleep(5)
    later = _resources()
    later["threads"] -= hung  # the hung workers are counted once, as hung
    return {"hung_workers": hung, "worker_errors": dict(died), "before": before, "end": end, "later": later}


def _error(error: BaseException) -> str:
    """What a worker died of: the exception's type and its first words (objects' addresses left out, so that
    the same error counts once)."""
    words = re.sub(r" at 0x[0-9a-f]+", "", str(error))[:120]
    return f"{type(error).__module__}.{type(error).__qualname__}: {words}"


def _client_process(client: str, target: str, seconds: float, concurrency: int, results) -> None:
    ledger = Ledger(client)
    try:
        if client.endswith("aio"):
            outcome = asyncio.run(_aio_client(client, target, seconds, concurrency, ledger))
        else:
            outcome = _sync_client(client, target, seconds, concurrency, ledger)
    except BaseException:
        import traceback
        results.put((client, {"error": traceback.format_exc()}))
        return
    with ledger.lock:
        outcome["calls"] = ledger.calls
    results.put((client, outcome))


# -- the run -------------------------------------------------------------------------------------------------------


def _summary(client: str, outcome: dict, attempts: List[list], peer_open: int) -> dict:
    if "error" in outcome:
        return {"client": client, "error": outcome["error"]}
    calls = outcome.pop("calls")
    statuses = collections.Counter(record[3] or "NEVER_ENDED" for record in calls.values())
    never = sum(1 for record in calls.values() if not record[2])
    twice = sum(1 for record in calls.values() if len(record[2]) > 1)
    first = min((record[0] for record in calls.values()), default=0.0)
    late = [{"id": call_id, "kind": kind, "began_s": round(start - first, 3), "timeout_s": round(timeout, 3),
             "ended_after_s": round(ends[0] - start, 3), "code": code}
            for call_id, (start, timeout, ends, code, kind) in calls.items()
            if ends and ends[0] - start > timeout + LATE_AFTER]
    orphans = 0
    for call_id, _, attempt_end in attempts:
        record = calls.get(call_id)
        if record is not None and record[2]:
            if attempt_end is None or attempt_end > record[2][0] + ORPHAN_AFTER:
                orphans += 1
    before, later = outcome["before"], outcome["later"]
    leaks = {key: later[key] - before[key] for key in ("threads", "fds", "tasks", "call_objects")
             if later[key] is not None and later[key] > before[key]}
    return {"client": client, "calls": len(calls), "success_rate": round(statuses["OK"] / max(1, len(calls)), 4),
            "statuses": dict(statuses.most_common()), "never_ended": never, "ended_twice": twice,
            "ended_late": len(late), "late_calls": late[:5], "hung_workers": outcome["hung_workers"],
            "worker_errors": outcome["worker_errors"],
            "orphan_attempts": orphans,
            "task_cancel_left_call_running": outcome.get("task_cancel_left_call_running", 0),
            "loop_errors": outcome.get("loop_errors", 0), "loop_lag_ms": outcome.get("loop_lag_ms"),
            "peer_streams_left_open": peer_open, "leaks": leaks, "before": before, "end": outcome["end"],
            "later": later}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the clients make calls")
    parser.add_argument("--aio-concurrency", type=int, default=64, help="calls in flight per asyncio client")
    parser.add_argument("--sync-concurrency", type=int, default=32, help="threads making calls per sync client")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="which clients, comma-separated")
    parser.add_argument("--check", action="store_true", help="exit 1 on any defect of a grpc_retry client")
    parser.add_argument("--deploy", action="store_true",
                        help="rolling deploys with surge behind a real DNS server instead of kills and faults")
    args = parser.parse_args()

    sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))  # the raw HTTP/2 peer the tests use
    if args.deploy:
        return deploy_mode(args)
    from support.h2_fault import MIXED, H2FaultServer

    context = multiprocessing.get_context("spawn")
    backends = Backends(context)
    clients = [c for c in args.clients.split(",") if c]
    peers = {client: H2FaultServer(MIXED) for client in clients}
    results = context.Queue()
    processes = [context.Process(target=_client_process, daemon=True, args=(
        client, "ipv4:" + ",".join([f"127.0.0.1:{port}" for port in backends.ports] + [peers[client].target]),
        args.seconds, args.aio_concurrency if client.endswith("aio") else args.sync_concurrency,
        results)) for client in clients]
    started = time.monotonic()
    for process in processes:
        process.start()
    backends.start_chaos()
    time.sleep(args.seconds)
    backends.stop_chaos()  # every backend is up again: what they report is what outlived its call
    outcomes: Dict[str, dict] = {}
    deadline = time.monotonic() + REPORT_WITHIN
    while len(outcomes) < len(processes) and time.monotonic() < deadline:
        try:
            client, outcome = results.get(timeout=1)
            outcomes[client] = outcome
        except queue.Empty:
            pass
    for client, process in zip(clients, processes, strict=True):
        process.join(max(0.0, deadline - time.monotonic()))
        if client not in outcomes:  # its calls, its close() or its workers hung
            outcomes[client] = {"error": f"hung: no report {REPORT_WITHIN:.0f} s after its calls stopped"}
            process.kill()
    attempts = backends.reports()
    backends.stop()

    failed = False
    for client in clients:
        peer = peers[client]
        summary = _summary(client, outcomes[client], attempts, peer.open_since(ORPHAN_AFTER))
        summary["peer_streams"] = peer.streams_seen
        peer.stop()
        print(json.dumps(summary))
        if client.startswith("grpc_retry") and ("error" in summary or
                summary["never_ended"] or summary["ended_twice"] or summary["ended_late"] or
                summary["hung_workers"] or summary["worker_errors"] or summary["orphan_attempts"] or
                summary["peer_streams_left_open"] or
                summary["task_cancel_left_call_running"] or summary["loop_errors"] or summary["leaks"]):
            failed = True
    print(json.dumps({"seconds": args.seconds, "elapsed": round(time.monotonic() - started, 1),
                      "backend_kills": backends.kills, "defects": failed}))
    return 1 if args.check and failed else 0


def deploy_mode(args: argparse.Namespace) -> int:
    """--deploy: the fleet of 3 pods is replaced again and again, one pod at a time with surge (each new pod in DNS
    3 s before its old one leaves DNS, which stops gracefully 3 s later, 1 s between pods), while a client of each
    kind calls
    through `dns://127.0.0.1:PORT/svc.test:PORT` with a retry policy; grpc_retry's with dns_refresh_ms 2000,
    grpcio's with its own defaults. With --check, any failed call of a grpc_retry client is a defect."""
    from support import deploy

    per_round = 3 * (3.0 + 3.0 + 1.0)
    rounds = max(1, int(args.seconds // per_round))
    clients = [c for c in args.clients.split(",") if c]
    settings = deploy.Settings(refresh_ms=2000, surge=3.0, gap=1.0, rounds=rounds, after=rounds * per_round + 3)
    started = time.monotonic()
    results = deploy.run("rolling", clients, settings)
    failed = False
    for result in results:
        summary = {"client": result.kind, **result.as_dict()}
        print(json.dumps(summary))
        if result.kind.startswith("grpc_retry") and result.failed:
            failed = True
    print(json.dumps({"mode": "deploy", "rounds": rounds, "pods_replaced": 3 * rounds,
                      "elapsed": round(time.monotonic() - started, 1), "defects": failed}))
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
