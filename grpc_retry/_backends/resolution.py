"""Names to addresses, shared by every channel of the process.

A `dns:` target is looked up when a channel is first used (a call, a connect: as grpcio, not when it is made),
again when one of its subchannels leaves READY or fails to connect (C-core's re-resolution, no sooner than
`grpc.dns_min_time_between_resolutions_ms` after the last lookup), and at least every `grpc_retry.dns_refresh_ms`
while a channel to it is open (beyond gRPC: so that a scale-up is seen with no connection lost). Channels to the
same name share one `Lookup`: one lookup per name and interval, whatever the number of channels, and its answer
goes to all of them.

Lookups block (the system's resolver: /etc/hosts, search domains; or, for dns://server/, that server through
dnspython), so they run on one resolver thread of the process, never on a caller's thread or an event loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from time import monotonic
from typing import Any, Dict, List, Optional, Protocol, Tuple

from grpc_retry._backends.target import Target, address_target
from grpc_retry._serial import SerialThread
from grpc_retry._timer import TIMERS, TimerHandle

log = logging.getLogger("grpc_retry")

# A DNS server that does not answer: give up on it after this long (the previous answer stays in use).
DNS_TIMEOUT = 5.0


class Subscriber(Protocol):
    refresh: float       # seconds between lookups with nothing lost (0: none)
    min_interval: float  # seconds between two lookups asked for on a loss

    def on_resolution(self, addresses: List[str], error: Optional[str]) -> None: ...


def lookup(target: Target) -> List[str]:
    """Every A and AAAA record of a dns target, as subchannel targets, in the resolver's order (blocking)."""
    if target.scheme != "dns":
        return list(target.addresses)
    if target.dns_server is not None:
        return _ask_server(target)
    if _numeric_shorthand(target.host):
        # libc reads "0.1" or "127.1" as an IPv4 address (inet_aton's old forms); gRPC's resolver takes only a
        # dotted quad as an address, and asks DNS for anything else, where such a name never exists.
        raise OSError(f"{target.host!r} is neither an IPv4 address (a.b.c.d) nor a DNS name")
    infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    return _unique((str(sockaddr[0]) for family, _, _, _, sockaddr in infos
                    if family in (socket.AF_INET, socket.AF_INET6)), target.port)


def _numeric_shorthand(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET, host)
        return False
    except OSError:
        pass
    try:
        socket.inet_aton(host)
        return True
    except OSError:
        return False


def _unique(hosts: Any, port: int) -> List[str]:
    seen: Dict[str, None] = {}
    for host in hosts:
        seen.setdefault(address_target(host, port))
    return list(seen)


def _ask_server(target: Target) -> List[str]:
    """A and AAAA records from the target's DNS server (dns://server[:port]/name), as gRPC's resolver asks it."""
    import dns.exception
    import dns.resolver

    assert target.dns_server is not None
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [target.dns_server[0]]
    resolver.port = target.dns_server[1]
    resolver.lifetime = DNS_TIMEOUT
    hosts: List[str] = []
    failures = []
    for kind in ("A", "AAAA"):
        try:
            answer = resolver.resolve(target.host, kind, search=False)
        except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN) as exc:
            failures.append(exc)
            continue
        except dns.exception.DNSException as exc:
            raise OSError(f"DNS server {target.dns_server[0]}:{target.dns_server[1]}: {exc}") from None
        hosts.extend(record.address for record in answer)
    if not hosts and failures and all(isinstance(f, dns.resolver.NXDOMAIN) for f in failures):
        raise OSError(f"{target.host!r} does not exist (NXDOMAIN)")
    return _unique(hosts, target.port)


class Lookup:
    """One name's lookups, shared by the channels (subscribers) to it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._subscribers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.running = False
        self.started = float("-inf")   # when the last lookup started
        self.count = 0                 # lookups so far (tests and benchmarks read it)
        self._timer: Optional[TimerHandle] = None
        self._timer_at = float("inf")

    def subscribe(self, subscriber: Subscriber) -> None:
        """A new channel: it gets the answer of a lookup made now (or of the one in progress)."""
        with self._lock:
            self._subscribers.add(subscriber)
        self._run()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            self._subscribers.discard(subscriber)
            if not self._subscribers and self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_at = None, float("inf")

    def reresolve(self, subscriber: Subscriber) -> None:
        """A subscriber lost a backend: look again, as soon as its minimum interval since the last lookup allows."""
        self._run_at(self.started + subscriber.min_interval)

    def _run_at(self, when: float) -> None:
        now = monotonic()
        if when <= now:
            self._run()
            return
        with self._lock:
            if self.running or when >= self._timer_at:
                return  # an answer, or a lookup at least as soon, is already on its way
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = TIMERS.schedule(when - now, self._due, shared=True)

    def _due(self) -> None:
        with self._lock:
            self._timer, self._timer_at = None, float("inf")
            if not self._subscribers:
                return
        self._run()

    def _run(self) -> None:
        with self._lock:
            if self.running:
                return
            self.running = True
            self.started = monotonic()
            self.count += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_at = None, float("inf")
        RESOLVER.submit(self._lookup)

    def _lookup(self) -> None:
        try:
            addresses = lookup(self.target)
            error = None if addresses else f"DNS resolution of {self.target.host!r} returned no addresses"
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode
            addresses, error = [], f"DNS resolution of {self.target.host!r} failed: {exc}"
        if error:
            log.warning("grpc_retry: %s", error)
        with self._lock:
            self.running = False
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            try:
                subscriber.on_resolution(addresses, error)
            except Exception:
                log.exception("grpc_retry: applying a resolution failed")
        # The next lookup with nothing lost: the shortest refresh of the channels still open.
        refreshes = [s.refresh for s in subscribers if s.refresh > 0]
        if refreshes:
            self._run_at(self.started + min(refreshes))


_lookups: Dict[Tuple[str, int, Optional[Tuple[str, int]]], Lookup] = {}
_lookups_lock = threading.Lock()


def shared_lookup(target: Target) -> Lookup:
    """The process's Lookup of `target` (made on first use; one per name, port and DNS server)."""
    key = (target.host, target.port, target.dns_server)
    with _lookups_lock:
        found = _lookups.get(key)
        if found is None:
            found = _lookups[key] = Lookup(target)
        return found


RESOLVER = SerialThread("grpc_retry-resolver")


def _after_fork() -> None:
    # Lookups in progress in the parent never answer in the child.
    for found in _lookups.values():
        found._lock = threading.Lock()
        found.running, found._timer, found._timer_at = False, None, float("inf")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
