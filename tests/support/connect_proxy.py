"""An HTTP CONNECT proxy on loopback (what `grpc_proxy` / `https_proxy` point gRPC clients at), which alone can
resolve some names: `names` maps a host name to the address it stands for. It records every CONNECT target it is
asked for, then pipes bytes both ways."""

from __future__ import annotations

import socket
import threading
from typing import Dict, List


class ConnectProxy:
    def __init__(self, names: Dict[str, str]) -> None:
        self.names = names
        self.connects: List[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        method, where, _ = line.split(" ", 2)
        self.connects.append(where)
        host, port = where.rsplit(":", 1)
        try:
            upstream = socket.create_connection((self.names.get(host, host), int(port)), timeout=5)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            client.close()
            return
        upstream.settimeout(None)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            upstream.sendall(rest)
        splice(client, upstream)

    def close(self) -> None:
        self._sock.close()


def splice(client: socket.socket, upstream: socket.socket) -> None:
    """Pipe bytes both ways between two connected sockets, a thread each way, until either side closes."""
    for a, b in ((client, upstream), (upstream, client)):
        threading.Thread(target=_pipe, args=(a, b), daemon=True, name="proxy-pipe").start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
