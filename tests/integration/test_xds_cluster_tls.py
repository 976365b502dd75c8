"""A Cluster's UpstreamTlsContext (gRFC A29) is accepted and rejected as grpcio's own xDS client does, whatever the
channel's credentials: both clients follow one control plane, their bootstraps naming the certificate provider
"mesh", and each variant is ACKed by both or NACKed by both with the same errors (field and words; a bad regex's
words after the core's prefix are RE2's there and Python's here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any, Iterator, List, Optional, Tuple

import pytest

pytest.importorskip("envoy")

from envoy.config.core.v3 import base_pb2, extension_pb2  # noqa: E402
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2  # noqa: E402
from envoy.type.matcher.v3 import regex_pb2, string_pb2  # noqa: E402
from google.protobuf import any_pb2, struct_pb2, wrappers_pb2  # noqa: E402
from support import GRPCIO  # noqa: E402
from support.control_plane import CLUSTER, ENDPOINTS, LISTENER, ROUTE, ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, listener, packed, route_config  # noqa: E402
from xds.core.v3 import extension_pb2 as xds_extension_pb2  # noqa: E402
from xds.type.v3 import typed_struct_pb2  # noqa: E402

from grpc_retry._backends.xds import resources  # noqa: E402
from grpc_retry._backends.xds.bootstrap import parse  # noqa: E402
from grpc_retry._backends.xds.client import NACKED, Watcher, XdsClient  # noqa: E402

MESH = "mesh"
TLS = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
AT = f"transport_socket.typed_config.value[{TLS}].common_tls_context"
# gRFC A82: grpcio takes system_root_certs from 1.73, before that only with this switch on
SYSTEM_ROOTS = GRPCIO >= (1, 73) or os.environ.get("GRPC_EXPERIMENTAL_XDS_SYSTEM_ROOT_CERTS", "").lower() in (
    "1", "t", "true", "y", "yes")
Validation = common_pb2.CertificateValidationContext
Combined = tls_pb2.CommonTlsContext.CombinedCertificateValidationContext
Matcher = string_pb2.StringMatcher


def instance(name: str = MESH, certificate: str = "") -> Any:
    return common_pb2.CertificateProviderPluginInstance(instance_name=name, certificate_name=certificate)


def old_instance(name: str = MESH, certificate: str = "") -> Any:
    """The deprecated CertificateProviderInstance, which gRPC still reads."""
    return tls_pb2.CommonTlsContext.CertificateProviderInstance(instance_name=name, certificate_name=certificate)


def validation(**fields: Any) -> Any:
    """A validation context with the CA from MESH; a field given None is left out."""
    return Validation(**_set({"ca_certificate_provider_instance": instance(), **fields}))


def common(**fields: Any) -> Any:
    """A CommonTlsContext with identity and CA from MESH; a field given None is left out."""
    defaults = {"tls_certificate_provider_instance": instance(), "validation_context": validation()}
    if "combined_validation_context" in fields or "validation_context_sds_secret_config" in fields:
        del defaults["validation_context"]
    return tls_pb2.CommonTlsContext(**_set({**defaults, **fields}))


def _set(fields: Any) -> Any:
    return {name: value for name, value in fields.items() if value is not None}


def tls_cluster(context: Any = None, typed_config: Optional[Any] = None, name: str = "envoy.transport_sockets.tls",
                **upstream: Any) -> Any:
    """Cluster "c1", its transport socket `typed_config` (by default: an UpstreamTlsContext of `context`)."""
    if typed_config is None:
        typed_config = packed(tls_pb2.UpstreamTlsContext(common_tls_context=context, **upstream))
    return cluster(lambda c: c.transport_socket.CopyFrom(base_pb2.TransportSocket(name=name,
                                                                                  typed_config=typed_config)))


def typed_struct(url: str) -> Any:
    return packed(typed_struct_pb2.TypedStruct(type_url=url, value=struct_pb2.Struct()))


def regex(pattern: str, ignore_case: bool = False) -> Any:
    return Matcher(safe_regex=regex_pb2.RegexMatcher(regex=pattern), ignore_case=ignore_case)


def extension() -> Any:
    return extension_pb2.TypedExtensionConfig(name="x", typed_config=packed(wrappers_pb2.StringValue()))


_EVERY_MATCHER = [Matcher(exact="spiffe://a"), Matcher(prefix="spiffe://b/", ignore_case=True),
                  Matcher(suffix="/c"), Matcher(contains="d"), regex("spiffe://e/.*")]
_IGNORED = common(alpn_protocols=["h2"], validation_context=validation(
    trusted_ca=base_pb2.DataSource(inline_string="pem"), watched_directory=base_pb2.WatchedDirectory(path="/d"),
    allow_expired_certificate=True, trust_chain_verification=Validation.ACCEPT_UNTRUSTED,
    match_typed_subject_alt_names=[common_pb2.SubjectAltNameMatcher(san_type=common_pb2.SubjectAltNameMatcher.DNS,
                                                                    matcher=Matcher(exact="x"))]))

# (name, the Cluster, valid)
VARIANTS: List[Tuple[str, Any, bool]] = [
    ("identity and CA from one provider", tls_cluster(common()), True),
    ("certificate names", tls_cluster(common(tls_certificate_provider_instance=instance(certificate="id"),
                                             validation_context=validation(
                                                 ca_certificate_provider_instance=instance(certificate="ca")))),
     True),
    ("the deprecated identity field", tls_cluster(common(
        tls_certificate_provider_instance=None, tls_certificate_certificate_provider_instance=old_instance())), True),
    ("the identity field before the deprecated one", tls_cluster(common(
        tls_certificate_certificate_provider_instance=old_instance("unknown"))), True),
    ("no identity", tls_cluster(common(tls_certificate_provider_instance=None)), True),
    ("SAN matchers of every kind", tls_cluster(common(validation_context=validation(
        match_subject_alt_names=_EVERY_MATCHER))), True),
    ("an empty exact SAN", tls_cluster(common(validation_context=validation(
        match_subject_alt_names=[Matcher(exact="")]))), True),
    ("a combined validation context", tls_cluster(common(combined_validation_context=Combined(
        default_validation_context=validation(), validation_context_certificate_provider_instance=old_instance(
            "unknown")))), True),
    ("the combined context's deprecated CA instance", tls_cluster(common(combined_validation_context=Combined(
        default_validation_context=validation(ca_certificate_provider_instance=None, match_subject_alt_names=[
            Matcher(exact="z")]), validation_context_certificate_provider_instance=old_instance()))), True),
    ("system root certs", tls_cluster(common(validation_context=validation(
        ca_certificate_provider_instance=None, system_root_certs=Validation.SystemRootCerts()))), SYSTEM_ROOTS),
    ("a CA instance before system root certs", tls_cluster(common(validation_context=validation(
        system_root_certs=Validation.SystemRootCerts()))), True),
    ("require_signed_certificate_timestamp false", tls_cluster(common(validation_context=validation(
        require_signed_certificate_timestamp=wrappers_pb2.BoolValue(value=False)))), True),
    ("fields gRPC ignores", tls_cluster(_IGNORED, name="", sni="x", auto_host_sni=True, allow_renegotiation=True,
                                        max_session_keys=wrappers_pb2.UInt32Value(value=3)), True),
    ("tls_certificates beside an identity instance", tls_cluster(common(
        tls_certificates=[common_pb2.TlsCertificate()])), True),
    ("a type URL of another host", tls_cluster(typed_config=any_pb2.Any(
        type_url=f"example.com/x/{TLS}", value=tls_pb2.UpstreamTlsContext(
            common_tls_context=common()).SerializeToString())), True),
    ("bytes that are no UpstreamTlsContext", tls_cluster(typed_config=any_pb2.Any(
        type_url=f"type.googleapis.com/{TLS}", value=b"\xff\xff\xff")), False),
    ("an unknown identity instance", tls_cluster(common(tls_certificate_provider_instance=instance("nope"))), False),
    ("an unknown CA instance", tls_cluster(common(validation_context=validation(
        ca_certificate_provider_instance=instance("nope")))), False),
    ("an unknown deprecated identity instance", tls_cluster(common(
        tls_certificate_provider_instance=None, tls_certificate_certificate_provider_instance=old_instance("x"))),
     False),
    ("an unknown deprecated CA instance", tls_cluster(common(combined_validation_context=Combined(
        validation_context_certificate_provider_instance=old_instance("x")))), False),
    ("the deprecated CA instance over system root certs", tls_cluster(common(combined_validation_context=Combined(
        default_validation_context=validation(ca_certificate_provider_instance=None,
                                              system_root_certs=Validation.SystemRootCerts()),
        validation_context_certificate_provider_instance=old_instance("x")))), False),
    ("an empty instance name", tls_cluster(common(validation_context=validation(
        ca_certificate_provider_instance=instance("")))), False),
    ("tls_certificates", tls_cluster(common(tls_certificate_provider_instance=None,
                                            tls_certificates=[common_pb2.TlsCertificate()])), False),
    ("tls_certificate_sds_secret_configs", tls_cluster(common(
        tls_certificate_provider_instance=None,
        tls_certificate_sds_secret_configs=[secret_pb2.SdsSecretConfig(name="s")])), False),
    ("validation_context_sds_secret_config", tls_cluster(common(
        validation_context_sds_secret_config=secret_pb2.SdsSecretConfig(name="s"))), False),
    ("tls_params", tls_cluster(common(tls_params=common_pb2.TlsParameters())), False),
    ("custom_handshaker", tls_cluster(common(custom_handshaker=extension())), False),
    ("verify_certificate_spki", tls_cluster(common(validation_context=validation(
        verify_certificate_spki=["spki"]))), False),
    ("verify_certificate_hash", tls_cluster(common(validation_context=validation(
        verify_certificate_hash=["hash"]))), False),
    ("require_signed_certificate_timestamp", tls_cluster(common(validation_context=validation(
        require_signed_certificate_timestamp=wrappers_pb2.BoolValue(value=True)))), False),
    ("crl", tls_cluster(common(validation_context=validation(crl=base_pb2.DataSource(inline_string="crl")))),
     False),
    ("custom_validator_config", tls_cluster(common(validation_context=validation(
        custom_validator_config=extension()))), False),
    ("a SAN matcher with no pattern", tls_cluster(common(validation_context=validation(
        match_subject_alt_names=[Matcher(exact="a"), Matcher()]))), False),
    ("a custom SAN matcher", tls_cluster(common(validation_context=validation(match_subject_alt_names=[
        Matcher(custom=xds_extension_pb2.TypedExtensionConfig(name="c", typed_config=packed(
            wrappers_pb2.StringValue())))]))), False),
    ("a bad SAN regex", tls_cluster(common(validation_context=validation(
        match_subject_alt_names=[regex("a(b")]))), False),
    ("ignore_case on a SAN regex", tls_cluster(common(validation_context=validation(
        match_subject_alt_names=[regex("a", ignore_case=True)]))), False),
    ("ignore_case on a bad SAN regex", tls_cluster(common(validation_context=validation(
        match_subject_alt_names=[regex("[", ignore_case=True)]))), False),
    ("no common_tls_context", tls_cluster(), False),
    ("no CA", tls_cluster(common(validation_context=None)), False),
    ("a validation context without a CA", tls_cluster(common(validation_context=validation(
        ca_certificate_provider_instance=None, match_subject_alt_names=[Matcher(exact="a")]))), False),
    ("the deprecated validation_context_certificate_provider_instance", tls_cluster(common(
        validation_context=None, validation_context_certificate_provider_instance=old_instance())), False),
    ("an empty combined validation context", tls_cluster(common(combined_validation_context=Combined())), False),
    ("errors in the combined context's default", tls_cluster(common(combined_validation_context=Combined(
        default_validation_context=validation(verify_certificate_hash=["h"], match_subject_alt_names=[
            Matcher()])))), False),
    ("many errors at once", tls_cluster(common(
        tls_certificate_provider_instance=None, tls_certificates=[common_pb2.TlsCertificate()],
        tls_params=common_pb2.TlsParameters(), validation_context=validation(
            ca_certificate_provider_instance=None, verify_certificate_spki=["a"],
            crl=base_pb2.DataSource(inline_string="x")))), False),
    ("another transport socket", tls_cluster(typed_config=packed(wrappers_pb2.StringValue())), False),
    ("no typed_config", cluster(lambda c: c.transport_socket.CopyFrom(base_pb2.TransportSocket(name="tls"))), False),
    ("an empty type URL", tls_cluster(typed_config=any_pb2.Any()), False),
    ("a type URL without a slash", tls_cluster(typed_config=any_pb2.Any(
        type_url=TLS, value=tls_pb2.UpstreamTlsContext(common_tls_context=common()).SerializeToString())), False),
    ("a type URL ending in a slash", tls_cluster(typed_config=any_pb2.Any(type_url="type.googleapis.com/")), False),
    ("a TypedStruct of UpstreamTlsContext", tls_cluster(typed_config=typed_struct(f"type.googleapis.com/{TLS}")),
     False),
    ("a TypedStruct of another type", tls_cluster(typed_config=typed_struct("type.googleapis.com/foo.Bar")), False),
    ("a TypedStruct without a type", tls_cluster(typed_config=typed_struct("")), False),
    ("bytes that are no TypedStruct", tls_cluster(typed_config=any_pb2.Any(
        type_url="type.googleapis.com/xds.type.v3.TypedStruct", value=b"\xff\xff")), False),
]

_GRPCIO = """
import sys, grpc
channel = grpc.insecure_channel("xds:///svc")
channel.subscribe(lambda state: None, try_to_connect=True)
sys.stdin.read()
"""
# (A file_watcher's files are read only under xDS credentials: these need not exist.)
PROVIDERS = {MESH: {"plugin_name": "file_watcher", "config": {
    "certificate_file": "/nonexistent/cert.pem", "private_key_file": "/nonexistent/key.pem",
    "ca_certificate_file": "/nonexistent/ca.pem"}}}


@pytest.fixture(scope="module")
def world() -> Iterator[Tuple[ControlPlane, XdsClient]]:
    """grpcio's xDS client (node "grpcio", in a process of its own) follows xds:///svc down to Cluster "c1";
    grpc_retry's (node "ours") watches "c1"."""
    plane = ControlPlane()
    base = [plane.set(listener()), plane.set(route_config()), plane.set(cluster()), plane.set(endpoints())]
    env = {**os.environ, "GRPC_VERBOSITY": "NONE",
           "GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("grpcio", certificate_providers=PROVIDERS)}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    process = subprocess.Popen([sys.executable, "-c", _GRPCIO], stdin=subprocess.PIPE, env=env)
    bootstrap = parse(plane.bootstrap("ours", certificate_providers=PROVIDERS))
    client = XdsClient(bootstrap.xds_servers[0], bootstrap.node,
                       certificate_providers=bootstrap.certificate_providers)
    watcher = Watcher()
    client.watch(resources.CLUSTER, "c1", watcher)
    try:
        for type_url, version in zip((LISTENER, ROUTE, CLUSTER, ENDPOINTS), base, strict=True):
            assert not plane.wait_answer("grpcio", type_url, version, timeout=20).nack
        assert not plane.wait_answer("ours", CLUSTER, base[2], timeout=20).nack
        yield plane, client
    finally:
        client.unwatch(resources.CLUSTER, "c1", watcher)
        client.close()
        assert process.stdin is not None
        process.stdin.close()
        process.wait(10)
        plane.close()


def grpcio_errors(nack: str) -> List[Tuple[str, str]]:
    """(field, words) of each error of grpcio's NACK of "c1"."""
    body = nack.split("errors validating Cluster resource: [", 1)[1]
    assert body.endswith("]]"), nack
    return sorted(re.findall(r"field:(\S+) error:(.*?)(?=; field:|$)", body[:-2]))


def our_errors(nack: str) -> List[Tuple[str, str]]:
    """(field, words) of each error of grpc_retry's NACK of "c1"."""
    prefix = "resource 'c1': "
    assert nack.startswith(prefix), nack
    return sorted((field, words) for field, words in (error.split(": ", 1) for error in
                                                      nack[len(prefix):].split("; ")))


def comparable(errors: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """A bad regex's words kept to the core's own (what follows are RE2's words there, Python's here)."""
    regex_words = "Invalid regex string specified in matcher: "
    return [(field, regex_words if words.startswith(regex_words) else words) for field, words in errors]


@pytest.mark.parametrize("name, resource, valid", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_grpcio_and_grpc_retry_accept_and_reject_a_clusters_tls_alike(
        world: Tuple[ControlPlane, XdsClient], name: str, resource: Any, valid: bool) -> None:
    plane, _ = world
    version = plane.set(resource)
    theirs, ours = (plane.wait_answer(node, CLUSTER, version) for node in ("grpcio", "ours"))
    assert (ours.nack, theirs.nack) == (not valid, not valid), (ours.error, theirs.error)
    if not valid:
        assert comparable(our_errors(ours.error)) == comparable(grpcio_errors(theirs.error))


def test_a_rejected_tls_keeps_the_last_good_one_serving(world: Tuple[ControlPlane, XdsClient]) -> None:
    """A46: the cluster's TLS after a NACK is the one last accepted."""
    plane, client = world
    good = plane.set(tls_cluster(common(validation_context=validation(
        match_subject_alt_names=[Matcher(exact="spiffe://cluster.local/ns/default/sa/backend")]))))
    assert not plane.wait_answer("ours", CLUSTER, good).nack
    bad = plane.set(tls_cluster(common(tls_certificate_provider_instance=instance("nope"))))
    assert plane.wait_answer("ours", CLUSTER, bad).nack
    (held,) = [r for r in client.snapshot() if r["type"] == "Cluster"]
    assert (held["status"], held["version"]) == (NACKED, str(good))
    assert held["tls"] == "identity mesh, ca mesh, SANs exact spiffe://cluster.local/ns/default/sa/backend"
    assert f"{AT}.tls_certificate_provider_instance.instance_name" in held["error"]
