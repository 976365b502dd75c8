"""A client process for the deployment scenarios: calls Unary on TARGET for SECONDS with CONCURRENCY calls in
flight (threads, or tasks on asyncio), each with a 2 s deadline and 10 ms between calls of a worker, through one
channel of KIND (grpc, grpc_retry, grpc.aio, grpc_retry.aio) with the options given as JSON. It prints "ready"
once its channel has made its first call, then, at the end, one JSON object: every call as [start, end, code,
responder] (times on the machine's monotonic clock, shared by every process).

    python tests/support/deploy_client.py KIND TARGET OPTIONS_JSON SECONDS [CONCURRENCY]
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import sys
import threading
import time
from typing import Any, List

UNARY = "/grpc_retry.test.Echo/Unary"
DEADLINE = 2.0
PAUSE = 0.01


def _record(calls: List[Any], start: float, code: str, responder: str) -> None:
    calls.append([round(start, 4), round(time.monotonic(), 4), code, responder])


def run_sync(kind: str, target: str, options: List[Any], seconds: float, concurrency: int) -> List[Any]:
    import grpc

    module: Any = grpc
    if kind == "grpc_retry":
        import grpc_retry
        module = grpc_retry
    channel = module.insecure_channel(target, options=options)
    unary = channel.unary_unary(UNARY)
    unary(b"", timeout=10, wait_for_ready=True)
    print("ready", flush=True)
    calls: List[Any] = []
    until = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                _record(calls, start, "OK", unary(b"", timeout=DEADLINE).decode())
            except grpc.RpcError as error:
                _record(calls, start, error.code().name, "!" + str(error.details()))
            time.sleep(PAUSE)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    channel.close()
    return calls


async def run_aio(kind: str, target: str, options: List[Any], seconds: float, concurrency: int) -> List[Any]:
    import grpc
    import grpc.aio

    module: Any = grpc.aio
    if kind == "grpc_retry.aio":
        import grpc_retry.aio
        module = grpc_retry.aio
    channel = module.insecure_channel(target, options=options)
    unary = channel.unary_unary(UNARY)
    await unary(b"", timeout=10, wait_for_ready=True)
    print("ready", flush=True)
    calls: List[Any] = []
    until = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                _record(calls, start, "OK", (await unary(b"", timeout=DEADLINE)).decode())
            except grpc.RpcError as error:
                _record(calls, start, error.code().name, "!" + str(error.details()))
            await asyncio.sleep(PAUSE)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await channel.close()
    return calls


def main() -> None:
    kind, target, options, seconds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
    concurrency = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    options = [tuple(option) for option in options]
    # Never a hang: past its time (the first call's 10 s deadline, the calls, the close, with room to spare) the
    # process prints every thread's stack and exits, so a test fails showing where it stuck.
    faulthandler.dump_traceback_later(seconds + 40, exit=True)
    if kind.endswith(".aio"):
        calls = asyncio.run(run_aio(kind, target, options, seconds, concurrency))
    else:
        calls = run_sync(kind, target, options, seconds, concurrency)
    print(json.dumps({"kind": kind, "calls": calls}), flush=True)


if __name__ == "__main__":
    main()
