"""A retry budget against A6's retry throttling, through one outage: three backends fail 10% of their calls, then
all of them for the outage, then 10% again. Calls go out continuously (a few in flight) through three channels in
turn, each with the same retry policy (5 attempts): the policy alone, with `retryThrottling` (A6's example:
maxTokens 10, tokenRatio 0.1) and with `grpc_retry.retry_budget` (GEP-3388's defaults: 20% of the calls over
10 s, and 10 a second). The servers count the attempts; per time bin, each channel's attempts per call and share
of calls that succeeded.

Prints one JSON object as its last line (per channel: the bins, and the attempts per call and the share of calls
that succeeded before, during and after the outage). With --plot FILE.png (matplotlib), a chart of both over time.
Usage: python bench/budget.py [--inflight N] [--phases S,S,S] [--bin S] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from concurrent import futures
from typing import Any, Dict, List, Tuple

import grpc

SERVICE = "bench.Budget"
CALL = f"/{SERVICE}/Call"
POLICY = {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
          "retryableStatusCodes": ["UNAVAILABLE"]}
CHANNELS = {
    "retry policy alone": ({}, []),
    "retryThrottling (10 tokens, 0.1)": ({"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}, []),
    "retry budget (20%, 10/s)": ({}, [("grpc_retry.retry_budget", "{}")]),
}


class _Backends:
    """Three in-process servers whose failure share the bench sets; they stamp every attempt."""

    def __init__(self) -> None:
        self.fail_share = 0.0
        self.stamps: List[float] = []
        self._lock = threading.Lock()
        self.servers, self.ports = [], []
        for _ in range(3):
            server = grpc.server(futures.ThreadPoolExecutor(16))
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
                "Call": grpc.unary_unary_rpc_method_handler(self._call)})])
            self.ports.append(server.add_insecure_port("127.0.0.1:0"))
            server.start()
            self.servers.append(server)

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.stamps.append(time.monotonic())
        if random.random() < self.fail_share:
            context.abort(grpc.StatusCode.UNAVAILABLE, "bench: failing")
        return request

    def stop(self) -> None:
        for server in self.servers:
            server.stop(None)


def _run(backends: _Backends, name: str, extra_config: Dict[str, Any], options: List[Tuple[str, Any]],
         phases: List[float], inflight: int, width: float) -> Dict[str, Any]:
    import grpc_retry

    config = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": POLICY}],
                         "loadBalancingConfig": [{"round_robin": {}}], **extra_config})
    # (each run's throttle or budget is its own: they are shared per target and settings)
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in backends.ports)
    channel = grpc_retry.insecure_channel(target, options=[("grpc.service_config", config), *options])
    method = channel.unary_unary(CALL)
    grpc.channel_ready_future(channel).result(timeout=10)
    ends: List[Tuple[float, bool]] = []
    lock = threading.Lock()
    backends.stamps.clear()
    start = time.monotonic()
    stop_at = start + sum(phases)

    def caller() -> None:
        while time.monotonic() < stop_at:
            try:
                method(b"x", timeout=5)
                ok = True
            except grpc.RpcError:
                ok = False
            with lock:
                ends.append((time.monotonic(), ok))
            time.sleep(0.002)  # (a steady rate of calls, not as many as the loop can make)

    def shares() -> None:
        for share, length in zip((0.1, 1.0, 0.1), phases, strict=True):
            backends.fail_share = share
            time.sleep(length)
        backends.fail_share = 0.1

    threads = [threading.Thread(target=caller) for _ in range(inflight)] + [threading.Thread(target=shares)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    channel.close()
    bins = int(sum(phases) / width)
    calls, attempts, ok = [0] * bins, [0] * bins, [0] * bins
    for at, good in ends:
        i = min(int((at - start) / width), bins - 1)
        calls[i] += 1
        ok[i] += good
    for at in list(backends.stamps):
        attempts[min(max(int((at - start) / width), 0), bins - 1)] += 1
    edges = [phases[0], phases[0] + phases[1]]

    def per_call(counts: List[int], lo: float, hi: float) -> float:
        chosen = [i for i in range(bins) if lo <= i * width < hi]
        return round(sum(counts[i] for i in chosen) / max(1, sum(calls[i] for i in chosen)), 3)

    def phased(counts: List[int]) -> Dict[str, float]:
        return {"before": per_call(counts, 0, edges[0]), "outage": per_call(counts, edges[0], edges[1]),
                "after": per_call(counts, edges[1], sum(phases))}
    return {"bins": [{"t": round(i * width, 3), "calls": calls[i], "attempts": attempts[i], "ok": ok[i]}
                     for i in range(bins)],
            "attempts_per_call": phased(attempts), "succeeded": phased(ok)}


def plot(result: Dict[str, Any], phases: List[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, layout="constrained")
    for name, run in result["channels"].items():
        times = [b["t"] for b in run["bins"]]
        top.plot(times, [b["attempts"] / max(1, b["calls"]) for b in run["bins"]], label=name)
        bottom.plot(times, [b["ok"] / max(1, b["calls"]) for b in run["bins"]], label=name)
    for axes in (top, bottom):
        axes.axvspan(phases[0], phases[0] + phases[1], color="tab:red", alpha=0.08)
        axes.grid(True, alpha=0.3)
    top.set(ylabel="attempts per call", title="Retries through an outage (shaded): 10% failures, all, then 10%")
    bottom.set(ylabel="calls that succeeded", xlabel="time (s)")
    top.legend(loc="upper right")
    figure.savefig(path, dpi=100)


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--phases", default="3,4,3", help="seconds: before, during and after the outage")
    parser.add_argument("--bin", type=float, default=0.25, help="seconds per bin")
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args(argv)
    phases = [float(p) for p in args.phases.split(",")]
    backends = _Backends()
    try:
        channels = {name: _run(backends, name, config, options, phases, args.inflight, args.bin)
                    for name, (config, options) in CHANNELS.items()}
    finally:
        backends.stop()
    result = {"grpcio": grpc.__version__, "phases_s": phases, "channels": channels}
    if args.plot:
        plot(result, phases, args.plot)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
