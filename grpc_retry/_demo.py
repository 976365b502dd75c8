"""`python -m grpc_retry demo`: the same workload through plain grpcio and through grpc_retry, side by side,
against three local backends (separate processes): one healthy, one failing a share of calls with UNAVAILABLE,
one with a slow tail. Prints a table per channel and what it means; `--plot` draws the latency CDFs.

The progress bar and the table use `rich`, the chart `matplotlib`: `pip install "grpc_retry[demo]"`. Without
rich the demo prints plain text."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import socket
import sys
import threading
import time
from concurrent import futures
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc

SERVICE = "demo.Echo"
CALL = f"/{SERVICE}/Call"
REPORT = f"/{SERVICE}/Report"
BACKENDS = ("healthy", "flaky", "slow")
GRPCIO, RETRY, HEDGING = "grpcio, retry policy", "grpc_retry, retry policy", "grpc_retry, hedging policy"
OUTLIERS = "grpc_retry, retry + outlier detection"
# gRFC A50: a backend failing over 30% of 10+ attempts in a 0.2 s sweep is out for 5 s (then longer).
OUTLIER_DETECTION = {"interval": "0.2s", "baseEjectionTime": "5s", "maxEjectionPercent": 34,
                     "failurePercentageEjection": {"threshold": 30, "minimumHosts": 3, "requestVolume": 10}}


# -- backends --------------------------------------------------------------------------------------------------


def _backend(kind: str, index: int, port: int, fail_share: float, slow_share: float, ready: Any) -> None:
    attempts: Dict[str, List[int]] = {}
    lock = threading.Lock()

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = dict(context.invocation_metadata())
        with lock:
            attempts.setdefault(str(metadata.get("demo-call", "")), []).append(
                int(str(metadata.get("grpc-previous-rpc-attempts", "0"))))
        if kind == "flaky" and random.random() < fail_share:
            context.abort(grpc.StatusCode.UNAVAILABLE, "demo: flaky backend")
        delay = 0.2 if kind == "slow" and random.random() < slow_share else 0.001
        time.sleep(delay)
        return request

    def report(request: bytes, context: grpc.ServicerContext) -> bytes:
        with lock:
            seen = dict(attempts)
            attempts.clear()
        return json.dumps({"backend": index, "attempts": seen}).encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "Call": grpc.unary_unary_rpc_method_handler(call),
        "Report": grpc.unary_unary_rpc_method_handler(report)})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    ready.put(port)
    server.wait_for_termination()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_backends(fail_share: float, slow_share: float) -> Tuple[List[Any], List[int]]:
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    ports = [_free_port() for _ in BACKENDS]
    processes = [context.Process(target=_backend, args=(kind, i, ports[i], fail_share, slow_share, ready),
                                 daemon=True) for i, kind in enumerate(BACKENDS)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=60)
    return processes, ports


def collect(ports: List[int]) -> Dict[str, List[Tuple[int, int]]]:
    """Each call's attempts as (attempt number, backend), from every backend, then cleared."""
    calls: Dict[str, List[Tuple[int, int]]] = {}
    for port in ports:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            report_method: Any = channel.unary_unary(REPORT)  # bytes in, bytes out
            report = json.loads(report_method(b"", timeout=10))
        for call_id, numbers in report["attempts"].items():
            calls.setdefault(call_id, []).extend((n, report["backend"]) for n in numbers)
    return calls


# -- the workload ----------------------------------------------------------------------------------------------


def configs(hedging_delay: float) -> Dict[str, Optional[Dict[str, Any]]]:
    retry = {"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                             "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}
    hedging = {"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": f"{hedging_delay}s",
                                 "nonFatalStatusCodes": ["UNAVAILABLE"]}}
    return {GRPCIO: retry, "grpc_retry, no policy": None, RETRY: retry, OUTLIERS: retry, HEDGING: hedging}


def service_config(policy: Optional[Dict[str, Any]], outliers: bool = False) -> str:
    method = {"name": [{"service": SERVICE}], **(policy or {})}
    lb: Dict[str, Any] = {"round_robin": {}}
    if outliers:
        lb = {"outlier_detection_experimental": {**OUTLIER_DETECTION, "childPolicy": [lb]}}
    return json.dumps({"methodConfig": [method], "loadBalancingConfig": [lb]})


def make_channel(name: str, target: str, policy: Optional[Dict[str, Any]], sync: bool) -> Any:
    options = [("grpc.service_config", service_config(policy, outliers=name == OUTLIERS))]
    if name.startswith("grpcio"):
        return grpc.insecure_channel(target, options=options) if sync else \
            grpc.aio.insecure_channel(target, options=options)
    import grpc_retry
    import grpc_retry.aio

    return grpc_retry.insecure_channel(target, options=options) if sync else \
        grpc_retry.aio.insecure_channel(target, options=options)


async def run_aio(channel: Any, prefix: str, calls: int, concurrency: int,
                  tick: Callable[[], None]) -> List[Tuple[float, bool]]:
    method = channel.unary_unary(CALL)
    results: List[Tuple[float, bool]] = []
    queue = list(range(calls))

    async def worker() -> None:
        while queue:
            n = queue.pop()
            started = time.perf_counter()
            try:
                await method(b"x", timeout=5, metadata=(("demo-call", f"{prefix}{n}"),))
                ok = True
            except grpc.RpcError:
                ok = False
            results.append((time.perf_counter() - started, ok))
            tick()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await channel.close()
    return results


def run_sync(channel: Any, prefix: str, calls: int, concurrency: int,
             tick: Callable[[], None]) -> List[Tuple[float, bool]]:
    method = channel.unary_unary(CALL)
    results: List[Tuple[float, bool]] = []
    queue = list(range(calls))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                n = queue.pop()
            started = time.perf_counter()
            try:
                method(b"x", timeout=5, metadata=(("demo-call", f"{prefix}{n}"),))
                ok = True
            except grpc.RpcError:
                ok = False
            with lock:
                results.append((time.perf_counter() - started, ok))
            tick()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    channel.close()
    return results


async def _aio_round(channel: Callable[[], Any], prefix: str, calls: int, concurrency: int,
                     tick: Callable[[], None]) -> List[Tuple[float, bool]]:
    async with channel() as warm:  # grpc.aio channels belong to the loop they are made in: made here
        await warm.channel_ready()
    return await run_aio(channel(), prefix, calls, concurrency, tick)


def summarize(results: List[Tuple[float, bool]], attempts: Dict[str, List[Tuple[int, int]]]) -> Dict[str, Any]:
    latencies = sorted(latency for latency, _ in results)

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000, 1)

    total = sum(len(a) for a in attempts.values())
    retries = new = 0
    for seen in attempts.values():
        used = set()
        for number, backend in sorted(seen):
            if number > 0:
                retries += 1
                new += backend not in used
            used.add(backend)
    return {"calls": len(results), "success": round(sum(ok for _, ok in results) / len(results), 4),
            "p50_ms": pct(50), "p99_ms": pct(99), "p999_ms": pct(99.9),
            "attempts_per_call": round(total / len(results), 3),
            "retries_to_a_new_backend": None if not retries else round(new / retries, 3),
            "latencies_ms": [x * 1000 for x in latencies]}


# -- output ----------------------------------------------------------------------------------------------------


def table(rows: Dict[str, Dict[str, Any]], out: Any) -> None:
    headers = ("channel", "success", "p50 ms", "p99 ms", "p99.9 ms", "attempts/call", "retries to a new backend")
    lines = [(name, f"{r['success']:.1%}", f"{r['p50_ms']}", f"{r['p99_ms']}", f"{r['p999_ms']}",
              f"{r['attempts_per_call']:.3f}",
              "-" if r["retries_to_a_new_backend"] is None else f"{r['retries_to_a_new_backend']:.0%}")
             for name, r in rows.items()]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
        for line in (headers, *lines):
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)), file=out)
        return
    rich_table = Table(title="The same workload, side by side", title_justify="left")
    for i, header in enumerate(headers):
        rich_table.add_column(header, justify="left" if i == 0 else "right")
    for line in lines:
        rich_table.add_row(*line)
    Console(file=out, width=max(110, Console(file=out).width)).print(rich_table)


def meaning(rows: Dict[str, Dict[str, Any]]) -> List[str]:
    grpcio, retry, hedging = rows[GRPCIO], rows[RETRY], rows[HEDGING]
    sentences = [
        f"With the same retry policy (2 attempts), grpc_retry succeeded on {retry['success']:.1%} of calls where "
        f"grpcio's own retries reached {grpcio['success']:.1%}: {retry['retries_to_a_new_backend'] or 0:.0%} of "
        f"grpc_retry's retries went to a backend the call had not used, "
        f"{grpcio['retries_to_a_new_backend'] or 0:.0%} of grpcio's (wherever its round_robin pointed next).",
        f"Outlier detection (gRFC A50) took the flaky backend out of the first attempts: "
        f"{rows[OUTLIERS]['attempts_per_call']:.2f} attempts per call instead of {retry['attempts_per_call']:.2f}.",
        f"Hedging, which grpcio ignores, cut the p99 from {grpcio['p99_ms']} ms to {hedging['p99_ms']} ms at "
        f"{hedging['attempts_per_call']:.2f} attempts per call: a call stuck on the slow backend is answered by "
        f"a hedge sent elsewhere.",
        "Nothing changed in the application but the channel constructor.",
    ]
    return sentences


def plot(rows: Dict[str, Dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for name, r in rows.items():
        latencies = r["latencies_ms"]
        axes.plot(latencies, [(i + 1) / len(latencies) for i in range(len(latencies))], label=name)
    axes.set_xscale("log")
    axes.set_xlabel("latency (ms, log scale)")
    axes.set_ylabel("share of calls")
    axes.set_title("Latency CDF, the same workload through each channel")
    axes.legend(loc="lower right")
    axes.grid(True, which="both", alpha=0.3)
    figure.savefig(path, dpi=100)
    plt.close(figure)


class _Progress:
    """A live progress bar (rich), or a plain count every 10%."""

    def __init__(self, total: int, out: Any) -> None:
        self._total, self._out, self._done = total, out, 0
        self._lock = threading.Lock()
        try:
            from rich.progress import Progress

            self._rich: Any = Progress(transient=True, console=None)
        except ImportError:
            self._rich = None

    def __enter__(self) -> _Progress:
        if self._rich is not None:
            self._rich.start()
            self._task = self._rich.add_task("calls", total=self._total)
        return self

    def describe(self, text: str) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=text)
        else:
            print(text, file=self._out)

    def tick(self) -> None:
        with self._lock:
            self._done += 1
            done = self._done
        if self._rich is not None:
            self._rich.update(self._task, completed=done)

    def __exit__(self, *exc: Any) -> None:
        if self._rich is not None:
            self._rich.stop()


def main(calls: int, concurrency: int, sync: bool, plot_path: Optional[str], fail_share: float, slow_share: float,
         as_json: bool, out: Any = None) -> int:
    out = out or sys.stdout
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print('demo: --plot needs matplotlib: pip install "grpc_retry[demo]"', file=sys.stderr)
            return 2
    processes, ports = start_backends(fail_share, slow_share)
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
    rows: Dict[str, Dict[str, Any]] = {}
    try:
        chosen = configs(hedging_delay=0.01)
        with _Progress(calls * len(chosen), out) as progress:
            for i, (name, policy) in enumerate(chosen.items()):
                progress.describe(name)
                channel = partial(make_channel, name, target, policy, sync)
                if sync:
                    with channel() as warm:  # every subchannel connected first, for every channel alike
                        grpc.channel_ready_future(warm).result(timeout=10)
                    results = run_sync(channel(), f"{i}-", calls, concurrency, progress.tick)
                else:
                    results = asyncio.run(_aio_round(channel, f"{i}-", calls, concurrency, progress.tick))
                attempts = {k: v for k, v in collect(ports).items() if k.startswith(f"{i}-")}
                rows[name] = summarize(results, attempts)
    finally:
        for process in processes:
            process.kill()
    if as_json:
        print(json.dumps({name: {k: v for k, v in r.items() if k != "latencies_ms"} for name, r in rows.items()}),
              file=out)
    else:
        print(f"{calls} unary calls per channel, {concurrency} in flight ({'sync' if sync else 'asyncio'} API), "
              f"round_robin over 3 backends: healthy, flaky ({fail_share:.0%} UNAVAILABLE), slow "
              f"({slow_share:.0%} take 200 ms).", file=out)
        table(rows, out)
        for sentence in meaning(rows):
            print(sentence, file=out)
    if plot_path is not None:
        plot(rows, plot_path)
        print(f"latency CDF written to {plot_path}", file=out)
    return 0
