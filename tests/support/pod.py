"""A backend "pod": a grpcio server in a process of its own on HOST:PORT, answering the test service's Unary method
with its own address, so that a client can tell which backend answered. SIGTERM stops it gracefully (GOAWAY,
`--grace` seconds for calls in flight), as Kubernetes stops a pod; `--max-age` sets the server's
max_connection_age (the usual way to make gRPC clients see new pods).

    python tests/support/pod.py 127.0.0.2 50051 [--max-age 3] [--grace 2]

`Pod` starts one from a test or a benchmark and waits until it serves.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures
from typing import List, Optional

UNARY = "/grpc_retry.test.Echo/Unary"


class Pod:
    def __init__(self, host: str, port: int, max_age: Optional[float] = None, grace: float = 2.0,
                 bind: Optional[str] = None) -> None:
        self.host, self.port = host, port
        args: List[str] = [sys.executable, os.path.abspath(__file__), bind or host, str(port), "--grace", str(grace)]
        if max_age is not None:
            args += ["--max-age", str(max_age)]
        self._process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if line != "ready":
            self._process.kill()
            raise RuntimeError(f"pod {host}:{port} did not start: {line!r}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, wait: bool = True) -> None:
        """Graceful: SIGTERM (the pod sends GOAWAY and lets its calls finish)."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        if wait:
            self.wait()

    def wait(self) -> None:
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()


def main() -> None:
    import faulthandler
    faulthandler.dump_traceback_later(30, exit=True)  # not serving by then: every stack printed, no hang

    import grpc

    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--max-age", type=float)
    parser.add_argument("--grace", type=float, default=2.0)
    args = parser.parse_args()
    me = f"{args.host}:{args.port}".encode()

    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        return me

    handler = grpc.method_handlers_generic_handler("grpc_retry.test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary)})
    options = [("grpc.so_reuseport", 0)]
    if args.max_age is not None:
        options += [("grpc.max_connection_age_ms", int(args.max_age * 1000)),
                    ("grpc.max_connection_age_grace_ms", 1000)]
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handler], options=options)
    host = f"[{args.host}]" if ":" in args.host else args.host
    if server.add_insecure_port(f"{host}:{args.port}") != args.port:
        print("bind failed", flush=True)
        sys.exit(1)
    server.start()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("ready", flush=True)
    faulthandler.cancel_dump_traceback_later()
    stopping.wait()
    server.stop(grace=args.grace).wait()


if __name__ == "__main__":
    main()
