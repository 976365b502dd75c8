"""`python -m grpc_retry demo`: the same workload through plain grpcio and through grpc_retry, side by side,
against three local backends (separate processes): one healthy, one failing a share of calls with UNAVAILABLE,
one with a slow tail. Prints one table, a row per channel, then a sentence per difference it shows; `--plot` draws
the latency tail of each channel.

The progress bar and the terminal table use `rich`, the chart `matplotlib`: the `demo` extra, installed from the
checkout (`pip install -e ".[demo]"`). Without rich the demo prints plain text, as it does when piped."""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import random
import shutil
import socket
import sys
import textwrap
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
NO_POLICY = "grpc_retry, no policy"
OUTLIERS = "grpc_retry, retry + outlier detection"
BUDGET = "grpc_retry, retry + retry budget"
BUDGET_OPTION = ("grpc_retry.retry_budget", "{}")  # GEP-3388's defaults: 20% of calls over 10 s, 10 a second
SLOW_S, HEDGING_DELAY_S = 0.2, 0.01  # the slow backend's tail; the hedging policy's delay before each hedge
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
        delay = SLOW_S if kind == "slow" and random.random() < slow_share else 0.001
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
    return {GRPCIO: retry, NO_POLICY: None, RETRY: retry, OUTLIERS: retry, BUDGET: retry, HEDGING: hedging}


def service_config(policy: Optional[Dict[str, Any]], outliers: bool = False) -> str:
    method = {"name": [{"service": SERVICE}], **(policy or {})}
    lb: Dict[str, Any] = {"round_robin": {}}
    if outliers:
        lb = {"outlier_detection_experimental": {**OUTLIER_DETECTION, "childPolicy": [lb]}}
    return json.dumps({"methodConfig": [method], "loadBalancingConfig": [lb]})


def make_channel(name: str, target: str, policy: Optional[Dict[str, Any]], sync: bool) -> Any:
    options = [("grpc.service_config", service_config(policy, outliers=name == OUTLIERS))]
    if name == BUDGET:
        options.append(BUDGET_OPTION)
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


def percentile(latencies: List[float], p: float) -> Optional[float]:
    """The p-th percentile (nearest rank) of sorted latencies in seconds, in ms to 0.1 ms; None if there are none."""
    if not latencies:
        return None
    return round(latencies[max(1, math.ceil(p / 100 * len(latencies))) - 1] * 1000, 1)


def summarize(results: List[Tuple[float, bool]], attempts: Dict[str, List[Tuple[int, int]]]) -> Dict[str, Any]:
    """One channel's figures; `--json` prints these keys per channel:

    - `calls`; `failed`: calls that ended with an error status; `success`: the share that did not;
    - `p50_ms`, `p99_ms`: latency of the calls that succeeded only, so that failing fast never makes a channel look
      fast (null if none succeeded);
    - `attempts_per_call`: attempts the backends received, per call;
    - `retries_to_a_new_backend`: the share of retries and hedges sent to a backend the call had not used yet
      (null if there were none).

    `latencies_ms` (the successes', sorted) is for the chart and left out of the JSON."""
    latencies = sorted(latency for latency, ok in results if ok)
    total = sum(len(a) for a in attempts.values())
    retries = new = 0
    for seen in attempts.values():
        used = set()
        for number, backend in sorted(seen):
            if number > 0:
                retries += 1
                new += backend not in used
            used.add(backend)
    return {"calls": len(results), "failed": len(results) - len(latencies),
            "success": round(len(latencies) / len(results), 4),
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "attempts_per_call": round(total / len(results), 3),
            "retries_to_a_new_backend": None if not retries else round(new / retries, 3),
            "latencies_ms": [x * 1000 for x in latencies]}


# -- output ----------------------------------------------------------------------------------------------------

HEADERS = ("channel", "failed", "p50 ms", "p99 ms", "attempts\nper call", "retries to a\nnew backend")
PROSE_WIDTH = 80  # the sentences wrap here, or at a narrower terminal's edge


def cells(rows: Dict[str, Dict[str, Any]]) -> List[Tuple[str, ...]]:
    def show(value: Optional[float], form: str = "") -> str:
        return "-" if value is None else format(value, form)

    return [(name, str(r["failed"]), show(r["p50_ms"]), show(r["p99_ms"]), show(r["attempts_per_call"], ".3f"),
             show(r["retries_to_a_new_backend"], ".0%")) for name, r in rows.items()]


def plain_table(rows: Dict[str, Dict[str, Any]]) -> List[str]:
    """The table as plain text lines, as wide as the table needs: whatever reads a pipe gets every cell whole."""
    body = cells(rows)
    heads = [header.split("\n") for header in HEADERS]
    height = max(len(lines) for lines in heads)
    heads = [[""] * (height - len(lines)) + lines for lines in heads]  # bottom-aligned, as rich aligns them
    widths = [max([len(text) for text in heads[i]] + [len(row[i]) for row in body]) for i in range(len(HEADERS))]

    def line(row: Tuple[str, ...]) -> str:
        return "  ".join(text.ljust(width) if i == 0 else text.rjust(width)
                         for i, (text, width) in enumerate(zip(row, widths, strict=True))).rstrip()

    return [*(line(tuple(lines[j] for lines in heads)) for j in range(height)),
            "-" * (sum(widths) + 2 * (len(widths) - 1)), *(line(row) for row in body)]


def rich_table(rows: Dict[str, Dict[str, Any]], out: Any) -> bool:
    """The table through rich, fitted to the terminal (a cell wraps only when the terminal is narrower than the
    table); False without rich."""
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in cells(rows):
        table.add_row(*row)
    Console(file=out).print(table)
    return True


def is_terminal(out: Any) -> bool:
    isatty = getattr(out, "isatty", None)
    return bool(isatty is not None and isatty())


def meaning(rows: Dict[str, Dict[str, Any]]) -> List[str]:
    """A sentence per difference the table shows, each saying what the figures say, whichever way they came out."""
    grpcio, retry, outliers, hedging = rows[GRPCIO], rows[RETRY], rows[OUTLIERS], rows[HEDGING]
    sentences = [f"With the same retry policy (2 attempts), {retry['failed']} of grpc_retry's {retry['calls']} calls "
                 f"failed and {grpcio['failed']} of grpcio's."]
    if retry["retries_to_a_new_backend"] is not None and grpcio["retries_to_a_new_backend"] is not None:
        sentences[0] += (f" {retry['retries_to_a_new_backend']:.0%} of grpc_retry's retries went to a backend the "
                         f"call had not used, {grpcio['retries_to_a_new_backend']:.0%} of grpcio's (wherever its "
                         f"round_robin pointed next).")
    if outliers["attempts_per_call"] < retry["attempts_per_call"]:
        sentences.append(f"Outlier detection (gRFC A50) took the flaky backend out of the first attempts: "
                         f"{outliers['attempts_per_call']:.2f} attempts per call instead of "
                         f"{retry['attempts_per_call']:.2f}.")
    budget = rows[BUDGET]
    sentences.append(f"A retry budget (retries at most 20% of the calls, and 10 a second) let through the "
                     f"retries this workload needs ({budget['attempts_per_call']:.2f} attempts per call, "
                     f"{budget['failed']} calls failed); in an outage it holds them to that share, where the retry "
                     f"policy alone sends every attempt it allows.")
    if None not in (grpcio["p99_ms"], hedging["p99_ms"]) and hedging["p99_ms"] < grpcio["p99_ms"]:
        sentences.append(f"Hedging, which grpcio ignores, cut the p99 from {grpcio['p99_ms']} ms (grpcio's retries) "
                         f"to {hedging['p99_ms']} ms at {hedging['attempts_per_call']:.2f} attempts per call: a call "
                         f"stuck on the slow backend is answered by a hedge sent elsewhere "
                         f"{HEDGING_DELAY_S * 1000:.0f} ms later.")
    sentences.append("Nothing changed in the application but the channel constructor.")
    return sentences


def report(rows: Dict[str, Dict[str, Any]], intro: str, out: Any) -> None:
    """The table and what it shows: rich's table on a terminal, plain lines elsewhere; sentences wrapped."""
    terminal = is_terminal(out)
    width = min(PROSE_WIDTH, shutil.get_terminal_size().columns) if terminal else PROSE_WIDTH

    def say(text: str, bullet: str = "") -> None:
        print(textwrap.fill(text, max(width, 40), initial_indent=bullet, subsequent_indent=" " * len(bullet),
                            break_long_words=False, break_on_hyphens=False), file=out)

    say(intro)
    print(file=out)
    if not (terminal and rich_table(rows, out)):
        print("\n".join(plain_table(rows)), file=out)
    calls = next(iter(rows.values()))["calls"]
    say(f"failed: calls (of {calls}) that ended with an error. p50, p99: latency of the calls that succeeded.")
    print(file=out)
    for sentence in meaning(rows):
        say(sentence, bullet="- ")


def tail(latencies_ms: List[float], calls: int, left: float, right: float) -> Tuple[List[float], List[float]]:
    """The steps of the share of calls not answered successfully after x ms, from `left`: a failed call never is,
    so the line ends level at the failed share (drawn out to `right`), or, with none failed, at its last success."""
    xs, ys = [left] + latencies_ms, [1.0] + [(calls - i) / calls for i in range(1, len(latencies_ms) + 1)]
    if ys[-1] > 0:
        return xs + [right], ys + [ys[-1]]
    return xs, ys[:-1] + ys[-2:-1]  # a log axis has no 0: the last call's step ends the line


def figure(rows: Dict[str, Dict[str, Any]]) -> Any:
    """The chart `--plot` writes: per channel the share of calls slower than x, log-log, so the tail shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    styles = {GRPCIO: ("black", "--"), NO_POLICY: ("tab:gray", ":"), RETRY: ("tab:blue", "-"),
              OUTLIERS: ("tab:green", "-."), BUDGET: ("tab:purple", (0, (5, 2))), HEDGING: ("tab:red", "-")}
    figure_, axes = plt.subplots(figsize=(10, 6), layout="constrained")
    left = min((r["latencies_ms"][0] for r in rows.values() if r["latencies_ms"]), default=1.0) * 0.8
    right = max((r["latencies_ms"][-1] for r in rows.values() if r["latencies_ms"]), default=1000.0) * 1.5
    for name, r in rows.items():
        color, style = styles.get(name, (None, "-"))
        xs, ys = tail(r["latencies_ms"], r["calls"], left, right)
        axes.step(xs, ys, where="post", color=color, linestyle=style, linewidth=2,
                  label=f"{name}: {r['failed']} failed, p99 {r['p99_ms']} ms")
    for x, text in ((HEDGING_DELAY_S * 1000, "hedging delay"), (SLOW_S * 1000, "slow backend's tail")):
        axes.axvline(x, color="tab:gray", linewidth=1, alpha=0.6)
        axes.annotate(text, (x, 0.01), xycoords=axes.get_xaxis_transform(), xytext=(-4, 0),  # at the foot: the
                      textcoords="offset points", ha="right", va="bottom", color="dimgray")  # legend is at the top
    calls = max(r["calls"] for r in rows.values())
    axes.set(xscale="log", yscale="log", xlim=(left, right), ylim=(0.5 / calls, 1.5),
             xlabel="latency x (ms, log scale)",
             ylabel="share of calls not answered successfully after x (log scale)",
             title="The latency tail of each channel (a failed call never answers: its share stays level)")
    axes.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # labels between the decades too
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y * 100:g}%"))
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(loc="upper right", fontsize="small")
    return figure_


def plot(rows: Dict[str, Dict[str, Any]], path: str) -> None:
    import matplotlib.pyplot as plt

    chart = figure(rows)
    chart.savefig(path, dpi=100)
    plt.close(chart)


class _Progress:
    """A live progress bar (rich) on stderr, or each channel's name there as its turn starts: stdout holds only the
    figures, so that it can be piped."""

    def __init__(self, total: int) -> None:
        self._total, self._done = total, 0
        self._lock = threading.Lock()
        try:
            from rich.console import Console
            from rich.progress import Progress

            self._rich: Any = Progress(transient=True, console=Console(stderr=True))
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
            print(text, file=sys.stderr)

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
            print('demo: --plot needs matplotlib, in the demo extra: pip install -e ".[demo]" in the checkout',
                  file=sys.stderr)
            return 2
        if not os.path.isdir(os.path.dirname(os.path.abspath(plot_path))):  # found out now, not after the run
            print(f"demo: --plot: no directory to write {plot_path} in", file=sys.stderr)
            return 2
    processes, ports = start_backends(fail_share, slow_share)
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
    rows: Dict[str, Dict[str, Any]] = {}
    try:
        chosen = configs(hedging_delay=HEDGING_DELAY_S)
        with _Progress(calls * len(chosen)) as progress:
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
        report(rows, f"{calls} unary calls per channel, {concurrency} in flight ({'sync' if sync else 'asyncio'} "
                     f"API), round_robin over 3 backends: healthy; flaky, failing {fail_share:.0%} of its calls "
                     f"with UNAVAILABLE; slow, holding {slow_share:.0%} of its calls {SLOW_S * 1000:.0f} ms.", out)
    if plot_path is not None:
        plot(rows, plot_path)
        print(f"latency tail chart written to {plot_path}", file=out)
    return 0
