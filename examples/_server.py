"""A local server for the examples: demo.Echo/Call echoes, failing the first `fail_first` attempts with
UNAVAILABLE and holding attempts for `slow_s` seconds when `slow` says so. Prints what it sees."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Callable, List, Optional

import grpc

SERVICE = "demo.Echo"
CALL = f"/{SERVICE}/Call"


class Server:
    def __init__(self, fail_first: int = 0, slow: Optional[Callable[[int], bool]] = None, slow_s: float = 1.0,
                 credentials: Optional[grpc.ServerCredentials] = None):
        self.attempts: List[str] = []
        self._lock = threading.Lock()
        self._fail_first, self._slow, self._slow_s = fail_first, slow, slow_s
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            SERVICE, {"Call": grpc.unary_unary_rpc_method_handler(self._call)})])
        address = "127.0.0.1:0"
        self.port = self._server.add_secure_port(address, credentials) if credentials else \
            self._server.add_insecure_port(address)
        self._server.start()

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        previous = str(dict(context.invocation_metadata()).get("grpc-previous-rpc-attempts", "0"))
        with self._lock:
            n = len(self.attempts)
            self.attempts.append(str(previous))
        print(f"  server: attempt {n + 1} (grpc-previous-rpc-attempts={previous})")
        if n < self._fail_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        if self._slow is not None and self._slow(n):
            time.sleep(self._slow_s)
        return b"echo: " + request

    def stop(self) -> None:
        self._server.stop(None)
