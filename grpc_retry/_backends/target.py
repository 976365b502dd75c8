"""Targets: `host:port`, `dns:[//server[:port]/]host[:port]`, `ipv4:a:p,…`, `ipv6:[a]:p,…`, `unix:path`.

Each address becomes a grpcio target string for one subchannel ("ipv4:1.2.3.4:80", "ipv6:[::1]:80",
"unix:/path"). Parsing happens at channel creation (a bad target raises ValueError there); DNS lookups happen
off the caller's thread (resolution.py)."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

DEFAULT_PORT = 443
DNS_PORT = 53


@dataclass(frozen=True)
class Target:
    scheme: str                      # "dns", "static", "whole" (grpcio resolves it: whole()), or "assigned"
                                     # (the channel's resolver gives its addresses: Subchannels.assign)
    host: str                        # for dns: the name to look up; for TLS: the name the certificate names
    port: int
    authority: str                   # what the subchannels send as :authority
    addresses: Tuple[str, ...] = ()  # static targets: the subchannel targets
    dns_server: Optional[Tuple[str, int]] = None  # dns://server[:port]/…: the DNS server to ask (else the system's)


def _port(text: str, target: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"target {target!r}: invalid port {text!r}")
    return int(text)


def _split_host_port(hostport: str, target: str) -> Tuple[str, int]:
    """'host:port', 'host', '[v6]:port', '[v6]' -> (host, port)."""
    if not hostport:
        raise ValueError(f"target {target!r}: missing host")
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise ValueError(f"target {target!r}: unterminated '[' in {hostport!r}")
        host, rest = hostport[1:end], hostport[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"target {target!r}: unexpected {rest!r} after ']'")
        port = _port(rest[1:], target) if rest else DEFAULT_PORT
    elif hostport.count(":") == 1:
        host, port_text = hostport.split(":")
        port = _port(port_text, target)
    elif ":" in hostport:
        if _literal(hostport) is None:
            raise ValueError(f"target {target!r}: {hostport!r} is neither host:port nor an IPv6 address")
        host, port = hostport, DEFAULT_PORT  # a bare IPv6 literal
    else:
        host, port = hostport, DEFAULT_PORT
    if not host:
        raise ValueError(f"target {target!r}: missing host")
    return host, port


def address_target(host: str, port: int) -> str:
    """The grpcio target of one resolved address."""
    if _canonical_ipv4(host):
        return f"ipv4:{host}:{port}"
    ip = ipaddress.ip_address(host)
    return f"ipv4:{ip}:{port}" if ip.version == 4 else f"ipv6:[{ip}]:{port}"


def _canonical_ipv4(host: str) -> bool:
    """Whether `host` is an IPv4 address written as ipaddress writes it (a.b.c.d), checked in C: ipaddress parses
    in Python (~10 us an address: 2.8 ms of a 300-address channel's creation, now 0.5 ms)."""
    try:
        return socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, host)) == host
    except (OSError, ValueError):
        return False


def _literal(host: str) -> Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _static_list(body: str, version: int, target: str) -> Tuple[str, ...]:
    addresses = []
    for item in body.split(","):
        item = item.strip()
        # As gRPC's core: an address of an ipv4: or ipv6: target names its port.
        if version == 6 and item and not item.startswith("[") or version == 4 and ":" not in item:
            raise ValueError(f"target {target!r}: address {item!r} has no port "
                             f"(ipv{version}: addresses are {'[a]:port' if version == 6 else 'a.b.c.d:port'})")
        host, port = _split_host_port(item, target)
        if version == 6 and item.endswith("]"):
            raise ValueError(f"target {target!r}: address {item!r} has no port (ipv6: addresses are [a]:port)")
        if version == 4 and _canonical_ipv4(host):
            addresses.append(f"ipv4:{host}:{port}")
            continue
        ip = _literal(host)
        if ip is None or ip.version != version:
            raise ValueError(f"target {target!r}: {host!r} is not an IPv{version} address")
        addresses.append(address_target(str(ip), port))
    return tuple(addresses)


# Schemes grpcio's core resolves that grpc_retry does not: such a target goes whole to one grpcio channel.
GRPCIO_SCHEMES = ("xds", "google-c2p", "google-c2p-experimental", "vsock")


def whole(target: str) -> Target:
    """A target grpcio resolves and balances itself, in one grpcio channel (its "address" is the target): grpc_retry
    still retries, hedges and reports; only the choice of backend per attempt is grpcio's."""
    return Target("whole", "", 0, target, (target,))


def proxied(target: Target, original: str, options: Sequence[Tuple[str, Any]]) -> bool:
    """Whether grpcio's channel would reach `target` through an HTTP CONNECT proxy (C-core's proxy mapper: the
    grpc.http_proxy option, else $grpc_proxy, $https_proxy, $http_proxy; off with grpc.enable_http_proxy 0; not
    for unix sockets, nor for hosts no_grpc_proxy / no_proxy names). grpc_retry must not resolve such a target:
    the proxy is to see the name."""
    given = dict(options)
    if target.scheme == "whole" or original.startswith(("unix:", "unix-abstract:")):
        return False
    if not given.get("grpc.enable_http_proxy", 1):
        return False
    proxy = given.get("grpc.http_proxy")
    if proxy is None:
        proxy = next((os.environ[n] for n in ("grpc_proxy", "https_proxy", "http_proxy") if os.environ.get(n)), "")
    if not proxy:
        return False
    exempt = os.environ.get("no_grpc_proxy") or os.environ.get("no_proxy") or ""
    hosts = [target.host] if target.scheme == "dns" or not target.addresses else \
        [a.split(":", 1)[1].rsplit(":", 1)[0].strip("[]") for a in target.addresses]
    return not all(_exempt(host, exempt) for host in hosts)


def _exempt(host: str, no_proxy: str) -> bool:
    """`host` is in a no_proxy list: "*", a name or a domain suffix (".example.com", "example.com"), an address, or
    an address block (CIDR)."""
    ip = _literal(host)
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if ip is not None and "/" in entry:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = host.lower()
        suffix = entry.lstrip(".")
        if name == suffix or name.endswith("." + suffix):
            return True
    return False


def parse_target(target: str) -> Target:
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target must be a non-empty string, got {target!r}")
    if target.startswith("unix:") or target.startswith("unix-abstract:"):
        path = target.split(":", 1)[1]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError(f"target {target!r}: missing socket path")
        return Target("static", "localhost", 0, "localhost", (target,))
    if target.startswith("ipv4:") or target.startswith("ipv6:"):
        addresses = _static_list(target[5:], 4 if target[3] == "4" else 6, target)
        first = addresses[0].split(":", 1)[1]  # "a:p" or "[a]:p": the authority the subchannels send
        host = first.rsplit(":", 1)[0].strip("[]")
        return Target("static", host, 0, first, addresses)
    body = target
    server = None
    if target.startswith("dns:"):
        body = target[4:]
        if body.startswith("//"):
            slash = body.find("/", 2)
            if slash < 0:
                raise ValueError(f"target {target!r}: expected dns://[server[:port]]/host[:port]")
            if slash > 2:
                server = _dns_server(body[2:slash], target)
            body = body[slash + 1:]
    elif target.split(":", 1)[0] in GRPCIO_SCHEMES:
        return whole(target)
    elif "://" in target:
        raise ValueError(f"target {target!r}: unsupported scheme {target.split(':', 1)[0]!r} "
                         f"(use dns:, ipv4:, ipv6:, unix:, {', '.join(s + ':' for s in GRPCIO_SCHEMES)} "
                         "or host:port)")
    host, port = _split_host_port(body, target)
    ip = _literal(host)
    if ip is not None:
        return Target("static", host, port, body, (address_target(str(ip), port),))
    return Target("dns", host, port, body, dns_server=server)


def _dns_server(authority: str, target: str) -> Tuple[str, int]:
    """The DNS server of a dns://server[:port]/ target: an IP address (as gRPC's resolver needs), port 53."""
    text = authority if authority.startswith("[") or authority.count(":") == 1 else \
        (f"[{authority}]" if ":" in authority else authority)
    host, port = _split_host_port(text, target)
    if port == DEFAULT_PORT and not text.endswith(":443"):
        port = DNS_PORT
    if _literal(host) is None:
        raise ValueError(f"target {target!r}: the DNS server {authority!r} must be an IP address[:port]")
    return host, port
