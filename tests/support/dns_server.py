"""A real DNS server on loopback (UDP, dnslib) whose answers a test changes while clients run.

`records` maps a name ("svc.test.") to its addresses; A and AAAA queries get the addresses of their family
(TTL 0), a known name of the other family gets an empty answer, an unknown name NXDOMAIN. It counts queries per
name. grpcio's resolver asks it through `dns://127.0.0.1:PORT/name:port` targets, as grpc_retry's does.
Usable in-process (tests) or as a process of its own: `python tests/support/dns_server.py PORT` reads
"name addr,addr" lines from stdin to change the answers (the soak's --deploy).
"""

from __future__ import annotations

import collections
import ipaddress
import socket
import sys
import threading
from typing import Dict, Iterable, List

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord


class DnsServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._records: Dict[str, List[str]] = {}
        self.queries: collections.Counter[str] = collections.Counter()
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._thread.start()

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """Answer `name` with these addresses from now on (an empty list: the name has no address)."""
        with self._lock:
            self._records[_fqdn(name)] = list(addresses)

    def count(self, name: str) -> int:
        with self._lock:
            return self.queries[_fqdn(name)]

    def target(self, name: str, port: int) -> str:
        return f"dns://127.0.0.1:{self.port}/{name}:{port}"

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self._sock.recvfrom(4096)
            except OSError:
                return  # closed
            if peer is None:
                return  # shut down by close()
            try:
                request = DNSRecord.parse(data)
            except Exception:
                continue
            reply = request.reply()
            name = str(request.q.qname)
            with self._lock:
                self.queries[name] += 1
                addresses = self._records.get(name)
            if addresses is None:
                reply.header.rcode = RCODE.NXDOMAIN
            else:
                for address in addresses:
                    version = ipaddress.ip_address(address).version
                    if request.q.qtype == QTYPE.A and version == 4:
                        reply.add_answer(RR(name, QTYPE.A, rdata=A(address), ttl=0))
                    elif request.q.qtype == QTYPE.AAAA and version == 6:
                        reply.add_answer(RR(name, QTYPE.AAAA, rdata=AAAA(address), ttl=0))
            try:
                self._sock.sendto(reply.pack(), peer)
            except OSError:
                return

    def close(self) -> None:
        # Closing a UDP socket does not wake a thread blocked in its recvfrom; shutting it down does (Linux reports
        # ENOTCONN for an unconnected socket, and wakes the reader all the same).
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self._sock.close()


def _fqdn(name: str) -> str:
    return name if name.endswith(".") else name + "."


def main() -> None:
    server = DnsServer(port=int(sys.argv[1]))
    print(server.port, flush=True)
    for line in sys.stdin:
        parts = line.split()
        if parts:
            server.set(parts[0], parts[1].split(",") if len(parts) > 1 else [])
            print("ok", flush=True)


if __name__ == "__main__":
    main()
