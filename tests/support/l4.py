"""An L4 (TCP) balancer on loopback: one address in front of several backends, as a Kubernetes ClusterIP or a
cloud network load balancer shows them. It spreads *connections*: each accepted connection is piped whole to one
backend, chosen in rotation or at random. It counts the connections each backend got."""

from __future__ import annotations

import random
import socket
import threading
from typing import List, Optional, Sequence

from support.connect_proxy import splice


class L4Balancer:
    def __init__(self, backends: Sequence[str], mode: str = "rotate", seed: Optional[int] = None) -> None:
        if mode not in ("rotate", "random"):
            raise ValueError(f"mode: rotate or random, got {mode!r}")
        self.backends = list(backends)
        self.mode = mode
        self.connections: List[int] = [0] * len(self.backends)
        self._random = random.Random(seed)
        self._next = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.target = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True, name="l4-accept").start()

    def _choose(self) -> int:
        with self._lock:
            if self.mode == "rotate":
                index, self._next = self._next, (self._next + 1) % len(self.backends)
            else:
                index = self._random.randrange(len(self.backends))
            self.connections[index] += 1
            return index

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            host, port = self.backends[self._choose()].rsplit(":", 1)
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                client.close()  # the backend is down: the client sees its connection reset, as through an LB
                continue
            upstream.settimeout(None)
            splice(client, upstream)

    def close(self) -> None:
        self._sock.close()
