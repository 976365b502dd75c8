"""Targets to subchannel addresses: every form the public contract names, and the ones it refuses."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpc_retry._backends.resolution import lookup as resolve
from grpc_retry._backends.target import address_target, parse_target


@pytest.mark.parametrize("target, addresses, authority", [
    ("ipv4:127.0.0.1:1,10.0.0.2:2", ["ipv4:127.0.0.1:1", "ipv4:10.0.0.2:2"], "127.0.0.1:1"),
    ("ipv6:[::1]:5,[fe80::1]:6", ["ipv6:[::1]:5", "ipv6:[fe80::1]:6"], "[::1]:5"),
    ("unix:/tmp/grpc.sock", ["unix:/tmp/grpc.sock"], "localhost"),
    ("10.1.2.3:80", ["ipv4:10.1.2.3:80"], "10.1.2.3:80"),
    ("[::1]:80", ["ipv6:[::1]:80"], "[::1]:80"),
])
def test_static_targets(target, addresses, authority):
    parsed = parse_target(target)
    assert (parsed.scheme, resolve(parsed), parsed.authority) == ("static", addresses, authority)


@pytest.mark.parametrize("target", ["localhost:{port}", "dns:///localhost:{port}",
                                    "dns:localhost:{port}"])
def test_dns_targets_resolve_every_address_of_the_name(target):
    parsed = parse_target(target.format(port=5001))
    assert (parsed.scheme, parsed.host, parsed.authority) == ("dns", "localhost", "localhost:5001")
    addresses = resolve(parsed)
    assert "ipv4:127.0.0.1:5001" in addresses and len(addresses) == len(set(addresses))
    assert all(a in ("ipv4:127.0.0.1:5001", "ipv6:[::1]:5001") for a in addresses)


def test_dns_default_port():
    assert parse_target("dns:///example.com").port == 443


@pytest.mark.parametrize("target", ["", "ipv4:", "ipv4:300.1.1.1:80", "ipv4:1.2.3.4:5,", "ipv6:[::1",
                                    "ipv6:127.0.0.1:80", "unix:", "host:port", "host:0", "127.0.0.1:99999",
                                    "dns:///", "dns://x", "dns:///:80", "http://host:80", "a:b:c", ":80"])
def test_unparseable_targets(target):
    with pytest.raises(ValueError):
        parse_target(target)


@pytest.mark.parametrize("target, server", [
    ("dns://127.0.0.1:5353/svc.test:50051", ("127.0.0.1", 5353)),
    ("dns://10.0.0.1/svc.test:50051", ("10.0.0.1", 53)),
    ("dns://[::1]:5353/svc.test:50051", ("::1", 5353)),
    ("dns:///svc.test:50051", None),
])
def test_dns_authority_names_the_server_to_ask(target, server):
    parsed = parse_target(target)
    assert (parsed.scheme, parsed.host, parsed.port, parsed.dns_server) == ("dns", "svc.test", 50051, server)


def test_dns_authority_must_be_an_address():
    with pytest.raises(ValueError, match="must be an IP address"):
        parse_target("dns://resolver.example/svc.test:1")


@pytest.mark.parametrize("host", ["0.1", "127.1", "0x7f.0.0.1", "2130706433"])
def test_numeric_shorthands_are_not_addresses_as_in_grpc(host):
    """libc's resolver reads these as IPv4 addresses; gRPC's takes only a dotted quad (grpcio's own tests use
    "0.1:1111" as a target that cannot resolve)."""
    with pytest.raises(OSError, match="neither an IPv4 address"):
        resolve(parse_target(f"{host}:1111"))
    assert resolve(parse_target("127.0.0.1:1111")) == ["ipv4:127.0.0.1:1111"]


@given(st.ip_addresses(v=4), st.integers(1, 65535), st.sampled_from(["", "0", "00"]))
def test_ipv4_lists_read_as_ipaddress_reads_them(ip, port, pad):
    """ipv4: addresses are checked in C (inet_pton), not by ipaddress (Python: ~10 us each, 300 of them a channel):
    the same addresses come out, and what ipaddress refuses (a leading zero) is refused."""
    text = ".".join(pad + part if pad and part != "0" else part for part in str(ip).split("."))
    try:
        expected = ipaddress.ip_address(text)
    except ValueError:
        with pytest.raises(ValueError):
            parse_target(f"ipv4:{text}:{port}")
        return
    assert parse_target(f"ipv4:{text}:{port}").addresses == (f"ipv4:{expected}:{port}",)
    assert address_target(text, port) == f"ipv4:{expected}:{port}"
