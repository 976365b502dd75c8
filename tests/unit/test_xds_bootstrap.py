"""The xDS bootstrap is read as grpcio reads it: the same documents accepted and rejected (grpcio's own xDS client,
in a process of its own, is the oracle), every problem named with its field, the environment consulted in gRPC's
order, and an `xds:` target's listener resource named as gRPC's resolver names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Tuple

import pytest

from grpc_retry._backends.xds import bootstrap
from grpc_retry._backends.xds.bootstrap import BootstrapError, load, parse

SERVER = {"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}


def doc(**fields: Any) -> str:
    return json.dumps({"xds_servers": [SERVER], **fields})


def server(**fields: Any) -> str:
    return json.dumps({"xds_servers": [{**SERVER, **fields}]})


# (name, the bootstrap's text, the field our error names, or None where it is valid)
CASES: List[Tuple[str, str, Optional[str]]] = [
    ("minimal", doc(), None),
    ("everything", doc(node={"id": "n", "cluster": "c", "locality": {"region": "r", "zone": "z", "sub_zone": "s"},
                             "metadata": {"k": [1, 2.5, {"x": None}]}},
                       server_listener_resource_name_template="grpc/server?xds.resource.listening_address=%s",
                       client_default_listener_resource_name_template="xdstp://a/envoy.config.listener.v3.Listener/%s",
                       authorities={"a": {"client_listener_resource_name_template":
                                          "xdstp://a/envoy.config.listener.v3.Listener/%s",
                                          "xds_servers": [SERVER]}, "b": {}},
                       certificate_providers={"p": {"plugin_name": "file_watcher",
                                                    "config": {"ca_certificate_file": "/ca.pem",
                                                               "refresh_interval": "60s"}}}), None),
    ("unknown fields are ignored", doc(surprise=1, node={"id": "n", "extra": [1]}), None),
    ("null optional fields", doc(node=None, authorities=None, certificate_providers=None), None),
    ("features", server(server_features=["ignore_resource_deletion", "xds_v3", 7]), None),
    ("first known creds", server(channel_creds=[{"type": "spiffe"}, {"type": "insecure"}]), None),
    ("google_default creds", server(channel_creds=[{"type": "google_default"}]), None),
    ("empty plugin name", doc(certificate_providers={"p": {"plugin_name": ""}}), None),
    ("authority with no servers", doc(authorities={"a": {"xds_servers": []}}), None),
    ("not an object", "[1]", "<root>"),
    ("not JSON", "{", "<root>"),
    ("empty", "", "<root>"),
    ("duplicate key", '{"xds_servers": [], "xds_servers": []}', "<root>"),
    ("too deep", doc(node={"metadata": json.loads('{"a":' * 300 + "1" + "}" * 300)}), "<root>"),
    ("no servers", "{}", "xds_servers"),
    ("empty servers", json.dumps({"xds_servers": []}), "xds_servers"),
    ("servers not a list", json.dumps({"xds_servers": {}}), "xds_servers"),
    ("no server_uri", json.dumps({"xds_servers": [{"channel_creds": [{"type": "insecure"}]}]}),
     "xds_servers[0].server_uri"),
    ("server_uri a number", server(server_uri=5), "xds_servers[0].server_uri"),
    ("no channel_creds", json.dumps({"xds_servers": [{"server_uri": "x"}]}), "xds_servers[0].channel_creds"),
    ("empty channel_creds", server(channel_creds=[]), "xds_servers[0].channel_creds"),
    ("no known creds", server(channel_creds=[{"type": "spiffe"}]), "xds_servers[0].channel_creds"),
    ("creds with no type", server(channel_creds=[{"config": {}}, {"type": "insecure"}]),
     "xds_servers[0].channel_creds[0].type"),
    ("creds config not an object", server(channel_creds=[{"type": "insecure", "config": 1}]),
     "xds_servers[0].channel_creds[0].config"),
    ("tls half a key pair", server(channel_creds=[{"type": "insecure"},
                                                  {"type": "tls", "config": {"certificate_file": "/c"}}]),
     "xds_servers[0].channel_creds[1].config"),
    ("features null", server(server_features=None), "xds_servers[0].server_features"),
    ("features not a list", server(server_features="ignore_resource_deletion"), "xds_servers[0].server_features"),
    ("node not an object", doc(node=[]), "node"),
    ("node id a number", doc(node={"id": 5}), "node.id"),
    ("zone a number", doc(node={"locality": {"zone": 1}}), "node.locality.zone"),
    ("metadata a list", doc(node={"metadata": []}), "node.metadata"),
    ("template not a string", doc(client_default_listener_resource_name_template=1),
     "client_default_listener_resource_name_template"),
    ("authority template elsewhere", doc(authorities={"a": {"client_listener_resource_name_template":
                                                           "xdstp://b/envoy.config.listener.v3.Listener/%s"}}),
     "authorities['a'].client_listener_resource_name_template"),
    ("authority servers invalid", doc(authorities={"a": {"xds_servers": [{"server_uri": "x"}]}}),
     "authorities['a'].xds_servers[0].channel_creds"),
    ("unknown plugin", doc(certificate_providers={"p": {"plugin_name": "vault"}}),
     "certificate_providers['p'].plugin_name"),
    ("plugin config null", doc(certificate_providers={"p": {"plugin_name": "file_watcher", "config": None}}),
     "certificate_providers['p'].config"),
    ("file_watcher with nothing", doc(certificate_providers={"p": {"plugin_name": "file_watcher", "config": {}}}),
     "certificate_providers['p'].config"),
    ("file_watcher bad interval", doc(certificate_providers={"p": {"plugin_name": "file_watcher", "config": {
        "ca_certificate_file": "/ca", "refresh_interval": "10"}}}),
     "certificate_providers['p'].config.refresh_interval"),
]


def _ours(text: str) -> Optional[List[str]]:
    try:
        parse(text)
    except BootstrapError as error:
        return error.errors
    return None


@pytest.mark.parametrize("name, text, field", CASES, ids=[c[0] for c in CASES])
def test_each_problem_is_named_with_its_field(name: str, text: str, field: Optional[str]) -> None:
    errors = _ours(text)
    if field is None:
        assert errors is None
    else:
        assert errors and any(e.startswith(f"{field}:") for e in errors), errors


# One bootstrap per process: grpcio keeps the bootstrap it parsed while any of its XdsClients lives, and one lives
# on a while after its channel closes, so the next channel of the same process may never read its own.
_ORACLE = """
import grpc, os
channel = grpc.insecure_channel("xds:///svc")
try:
    channel.unary_unary("/a.B/C")(b"", timeout=0.3)
    print("accepted")
except grpc.RpcError as error:
    print("rejected: " + error.details() if "Failed to create XdsClient" in (error.details() or "") else "accepted")
"""


def _grpcio_verdict(text: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_XDS_BOOTSTRAP")}
    env.update(GRPC_VERBOSITY="NONE", GRPC_XDS_BOOTSTRAP_CONFIG=text)
    done = subprocess.run([sys.executable, "-c", _ORACLE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_grpcio_accepts_and_rejects_the_same_bootstraps() -> None:
    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(_grpcio_verdict, [text for _, text, _ in CASES]))
    differ = [(name, verdict, _ours(text)) for (name, text, _), verdict in zip(CASES, verdicts, strict=True)
              if verdict.startswith("rejected") != (_ours(text) is not None)]
    assert not differ


def test_what_is_read() -> None:
    got = parse(CASES[1][1])
    assert got.xds_servers == (bootstrap.XdsServer("127.0.0.1:1", "insecure"),)
    assert got.node.id == "n" and got.node.locality == bootstrap.Locality("r", "z", "s")
    assert got.node.metadata == {"k": [1, 2.5, {"x": None}]}
    assert got.authorities["a"].xds_servers == got.xds_servers and got.authorities["b"].xds_servers == ()
    assert got.servers("b") == got.xds_servers and got.servers(None) == got.xds_servers
    assert got.certificate_providers["p"] == ("file_watcher", {"ca_certificate_file": "/ca.pem",
                                                               "refresh_interval": "60s"})
    features = parse(server(server_features=["ignore_resource_deletion", "xds_v3"])).xds_servers[0]
    assert features.features == frozenset({"ignore_resource_deletion"}) and features.ignore_resource_deletion
    first = parse(server(channel_creds=[{"type": "spiffe"}, {"type": "google_default", "config": {"a": 1}},
                                        {"type": "insecure"}])).xds_servers[0]
    assert (first.channel_creds, first.channel_creds_config) == ("google_default", {"a": 1})


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(BootstrapError) as caught:
        parse(json.dumps({"xds_servers": [{"server_uri": 1}], "node": {"id": 2}}), "GRPC_XDS_BOOTSTRAP=/b.json")
    message = str(caught.value)
    assert message.startswith("invalid xDS bootstrap (GRPC_XDS_BOOTSTRAP=/b.json): ")
    assert {e.split(":")[0] for e in caught.value.errors} == {
        "xds_servers[0].server_uri", "xds_servers[0].channel_creds", "node.id"}


def test_authorities_are_read_only_with_federation() -> None:
    text = doc(authorities={"a": 1}, client_default_listener_resource_name_template=2)
    with pytest.raises(BootstrapError):
        parse(text)
    got = parse(text, federation=False)
    assert got.authorities == {} and got.client_default_listener_resource_name_template == ""
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": text}
    for value, on in (("true", True), ("YES", True), ("1", True), ("false", False), ("on", False), ("0", False)):
        if on:
            with pytest.raises(BootstrapError):
                load({**env, "GRPC_EXPERIMENTAL_XDS_FEDERATION": value})
        else:
            assert load({**env, "GRPC_EXPERIMENTAL_XDS_FEDERATION": value}).authorities == {}


def test_the_environment_in_grpcs_order(tmp_path: Any) -> None:
    path = tmp_path / "bootstrap.json"
    path.write_text(server(server_uri="from-file:1"))
    config = server(server_uri="from-config:1")
    assert load({"GRPC_XDS_BOOTSTRAP": str(path), "GRPC_XDS_BOOTSTRAP_CONFIG": config}
                ).xds_servers[0].server_uri == "from-file:1"
    assert load({"GRPC_XDS_BOOTSTRAP_CONFIG": config}).xds_servers[0].server_uri == "from-config:1"
    got = load({"GRPC_XDS_BOOTSTRAP": str(path)})
    assert got.source == f"GRPC_XDS_BOOTSTRAP={path}"
    for env, words in (({}, "neither GRPC_XDS_BOOTSTRAP"),
                       ({"GRPC_XDS_BOOTSTRAP": str(tmp_path / "missing.json"), "GRPC_XDS_BOOTSTRAP_CONFIG": config},
                        "missing.json"),
                       ({"GRPC_XDS_BOOTSTRAP": "", "GRPC_XDS_BOOTSTRAP_CONFIG": config}, "cannot be read")):
        with pytest.raises(BootstrapError, match=words):
            load(env)


@pytest.mark.parametrize("authority, name, listener", [
    ("", "svc.example:8080", "svc.example:8080"),
    ("a", "svc", "xdstp://a/envoy.config.listener.v3.Listener/svc"),
    ("a", "my svc/v1?x=é", "xdstp://a/envoy.config.listener.v3.Listener/my%20svc/v1%3Fx=%C3%A9"),
    ("b", "svc", "xdstp://b/custom/svc"),
])
def test_a_target_asks_for_the_listener_grpc_would(authority: str, name: str, listener: str) -> None:
    got = parse(doc(authorities={"a": {}, "b": {"client_listener_resource_name_template": "xdstp://b/custom/%s"}}))
    assert got.listener_name(authority, name) == listener


def test_the_default_template_and_an_unknown_authority() -> None:
    got = parse(doc(client_default_listener_resource_name_template="xdstp://a/L/%s", authorities={"a": {}}))
    assert got.listener_name("", "s p") == "xdstp://a/L/s%20p"
    assert parse(doc(client_default_listener_resource_name_template="prefix/%s")).listener_name("", "s p") == \
        "prefix/s p"
    with pytest.raises(ValueError, match="no authority 'z'"):
        got.listener_name("z", "svc")
