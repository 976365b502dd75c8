"""What idle channels cost a process: run as a process of its own per client kind, so that the figures are its own.

    python tests/support/resources.py KIND CHANNELS ADDRESSES PORT [SECONDS]

Makes CHANNELS sync channels of KIND (grpc or grpc_retry), round_robin over ADDRESSES loopback addresses
(127.0.1.1, 127.0.1.2, … on PORT, where one server listens on 0.0.0.0), makes one call on each, waits until every
subchannel is READY, then measures for SECONDS: the process's threads (every OS thread, grpcio's included), the CPU
it uses while idle (share of one core), and how long closing one channel takes (the median and the longest).
Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

import grpc

UNARY = "/grpc_retry.test.Echo/Unary"


def addresses(count: int, port: int) -> str:
    return "ipv4:" + ",".join(f"127.0.{1 + i // 250}.{1 + i % 250}:{port}" for i in range(count))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def measure(kind: str, channels: int, count: int, port: int, seconds: float) -> Dict[str, Any]:
    module: Any = grpc
    if kind == "grpc_retry":
        import grpc_retry
        module = grpc_retry
    before = threads()
    target = addresses(count, port)
    options = [("grpc.lb_policy_name", "round_robin")]
    made: List[Any] = [module.insecure_channel(target, options=options) for _ in range(channels)]
    for channel in made:
        channel.unary_unary(UNARY)(b"", timeout=30, wait_for_ready=True)
    if kind == "grpc_retry":  # every subchannel connected, as round_robin keeps them
        until = time.monotonic() + 60
        while time.monotonic() < until and not all(
                all(s == 2 for s in c._subchannels.picker.states()) for c in made):
            time.sleep(0.05)
    else:
        time.sleep(2.0)
    time.sleep(1.0)
    busy = threads()
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(seconds)
    idle_cpu = (time.process_time() - cpu) / (time.monotonic() - wall)
    closes = []
    for channel in made:
        started = time.perf_counter()
        channel.close()
        closes.append(time.perf_counter() - started)
    return {"kind": kind, "channels": channels, "addresses": count, "threads_before": before, "threads": busy,
            "idle_cpu_percent": round(idle_cpu * 100, 3), "close_ms_median": round(statistics.median(closes) * 1e3, 2),
            "close_ms_max": round(max(closes) * 1e3, 2)}


def main() -> None:
    kind, channels, count, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
    print(json.dumps(measure(kind, channels, count, port, seconds)), flush=True)


if __name__ == "__main__":
    main()
