"""A real HTTP/2 peer, built with the `h2` package, that misbehaves on purpose: it refuses streams
(RST_STREAM REFUSED_STREAM), sends GOAWAY before looking at a stream, resets streams with INTERNAL_ERROR,
stalls, answers with a status code gRPC does not define, allows no stream at all — or, MIXED, any of the first
four per stream, at random. It speaks just enough gRPC to be reached by a grpcio client; it never answers
successfully. It counts the stalled streams the client has not yet reset (`open`): a client that ended a call but
left its stream open here leaks it."""

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Dict, List, Tuple

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

REFUSE = "refuse"
GOAWAY = "goaway"
RESET = "reset"
STALL = "stall"
UNKNOWN_CODE = "unknown_code"  # a Trailers-Only answer with grpc-status 42, a code gRPC does not define
NO_STREAMS = "no_streams"  # SETTINGS_MAX_CONCURRENT_STREAMS 0: the client holds its streams, metadata unsent
MIXED = "mixed"
_MIXED = (REFUSE, REFUSE, GOAWAY, RESET, STALL, STALL)


class H2FaultServer:
    def __init__(self, mode: str):
        self.mode = mode
        self.streams_seen = 0
        self.connections = 0
        self.open: Dict[Tuple[int, int], float] = {}  # (connection, stream) -> when the stall began
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self.target = f"127.0.0.1:{self.port}"
        self._stopped = threading.Event()
        self._conns: List[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="h2-fault-accept", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress; close() alone does not
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="h2-fault-conn", daemon=True).start()

    def open_since(self, seconds: float) -> int:
        """Stalled streams still open that began at least `seconds` ago."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for began in self.open.values() if now - began >= seconds)

    def _serve(self, sock: socket.socket) -> None:
        key = id(sock)
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        conn = h2.connection.H2Connection(config=config)
        if self.mode == NO_STREAMS:
            conn.local_settings = h2.settings.Settings(
                client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0})
        conn.initiate_connection()
        try:
            sock.sendall(conn.data_to_send())
            gone_away = False
            while not self._stopped.is_set():
                data = sock.recv(65536)
                if not data:
                    return
                if gone_away:
                    # As a real server after GOAWAY: the connection stays up for the client to close, so the
                    # client learns of the GOAWAY rather than of a broken pipe under a stream it is writing.
                    continue
                close = False
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        with self._lock:
                            self.streams_seen += 1
                        close = self._fault(conn, key, event.stream_id) or close
                    elif isinstance(event, h2.events.StreamReset):
                        with self._lock:
                            self.open.pop((key, event.stream_id), None)
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                sock.sendall(conn.data_to_send())
                gone_away = close
        except (OSError, h2.exceptions.ProtocolError):
            return
        finally:
            with self._lock:  # the connection's streams end with it
                for stream in [k for k in self.open if k[0] == key]:
                    del self.open[stream]
            try:
                sock.close()
            except OSError:
                pass

    def _fault(self, conn: h2.connection.H2Connection, key: int, stream_id: int) -> bool:
        """Act on a new stream; True when the connection is going away (GOAWAY sent)."""
        mode = random.choice(_MIXED) if self.mode == MIXED else self.mode
        if mode == STALL:
            with self._lock:
                self.open[(key, stream_id)] = time.monotonic()
        elif mode == REFUSE:
            conn.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
        elif mode == RESET:
            conn.reset_stream(stream_id, ErrorCodes.INTERNAL_ERROR)
        elif mode == UNKNOWN_CODE:
            conn.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc"),
                                          ("grpc-status", "42"), ("grpc-message", "what")], end_stream=True)
        elif mode == GOAWAY:
            # The stream is above last_stream_id: the server says it never processed it.
            conn.close_connection(error_code=ErrorCodes.NO_ERROR, last_stream_id=stream_id - 2 if stream_id > 2 else 0)
            return True
        return False
