"""A Cluster's transport socket decoded into the TLS it asks for (gRFC A29): which certificate provider instances
give the identity and the CA, which SANs the server must have, the fields in gRPC's order of precedence, and the
checks that follow the installed grpcio's release. (Each rule's verdict is compared with grpcio's own client in
tests/integration/test_xds_cluster_tls.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import grpc
import pytest

pytest.importorskip("envoy")

from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2  # noqa: E402
from envoy.type.matcher.v3 import regex_pb2, string_pb2  # noqa: E402
from google.protobuf import any_pb2  # noqa: E402

from grpc_retry._backends.xds import clusters, resources  # noqa: E402
from grpc_retry._backends.xds.errors import ResourceError  # noqa: E402
from grpc_retry._backends.xds.upstream_tls import (  # noqa: E402
    SYSTEM_ROOT_CERTS_ENV,
    CertificateProvider,
    SanMatcher,
    UpstreamTls,
    describe,
)

AT = "transport_socket.typed_config.value[envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext]" \
     ".common_tls_context"
MESH = CertificateProvider("mesh")
Validation = common_pb2.CertificateValidationContext
Combined = tls_pb2.CommonTlsContext.CombinedCertificateValidationContext


def instance(name: str = "mesh", certificate: str = "") -> Any:
    return common_pb2.CertificateProviderPluginInstance(instance_name=name, certificate_name=certificate)


def old_instance(name: str = "mesh", certificate: str = "") -> Any:
    return tls_pb2.CommonTlsContext.CertificateProviderInstance(instance_name=name, certificate_name=certificate)


def encoded(common: Optional[Any]) -> bytes:
    """Cluster "c1" (EDS), its transport socket an UpstreamTlsContext of `common` (None: no transport socket)."""
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.core.v3 import config_source_pb2

    message = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS, eds_cluster_config=(
        cluster_pb2.Cluster.EdsClusterConfig(eds_config=config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource()))))
    if common is not None:
        packed = any_pb2.Any()
        packed.Pack(tls_pb2.UpstreamTlsContext(common_tls_context=common))
        message.transport_socket.CopyFrom(base_pb2.TransportSocket(name="envoy.transport_sockets.tls",
                                                                   typed_config=packed))
    return message.SerializeToString()


def tls_of(common: Optional[Any], providers: frozenset[str] = frozenset({"mesh"})) -> Optional[UpstreamTls]:
    return clusters.decode(encoded(common), providers)[1].tls


def rejected(common: Any, providers: frozenset[str] = frozenset({"mesh"})) -> list[str]:
    with pytest.raises(ResourceError) as caught:
        clusters.decode(encoded(common), providers)
    return caught.value.errors


def test_a_cluster_without_a_transport_socket_is_plaintext() -> None:
    assert tls_of(None) is None
    assert describe(None) == "plaintext"


def test_identity_ca_and_san_matchers() -> None:
    tls = tls_of(tls_pb2.CommonTlsContext(
        tls_certificate_provider_instance=instance(certificate="id"),
        validation_context=Validation(ca_certificate_provider_instance=instance("roots"), match_subject_alt_names=[
            string_pb2.StringMatcher(exact="spiffe://td/ns/a/sa/b"),
            string_pb2.StringMatcher(prefix="spiffe://td/", ignore_case=True),
            string_pb2.StringMatcher(suffix="/b"), string_pb2.StringMatcher(contains="sa"),
            string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex="spiffe://.*"))])),
        frozenset({"mesh", "roots"}))
    assert tls == UpstreamTls(CertificateProvider("mesh", "id"), CertificateProvider("roots"), (
        SanMatcher("exact", "spiffe://td/ns/a/sa/b"), SanMatcher("prefix", "spiffe://td/", True),
        SanMatcher("suffix", "/b"), SanMatcher("contains", "sa"), SanMatcher("safe_regex", "spiffe://.*")))
    assert describe(tls) == ("identity mesh (certificate id), ca roots, SANs exact spiffe://td/ns/a/sa/b or prefix "
                             "spiffe://td/ (ignore case) or suffix /b or contains sa or safe_regex spiffe://.*")
    with pytest.raises(dataclasses.FrozenInstanceError):
        tls.identity = None  # type: ignore[misc]


def test_the_identity_field_before_the_deprecated_one() -> None:
    both = tls_pb2.CommonTlsContext(tls_certificate_provider_instance=instance(),
                                    tls_certificate_certificate_provider_instance=old_instance("other", "x"),
                                    validation_context=Validation(ca_certificate_provider_instance=instance()))
    assert tls_of(both) == UpstreamTls(MESH, MESH)
    both.ClearField("tls_certificate_provider_instance")
    assert tls_of(both, frozenset({"mesh", "other"})) == UpstreamTls(CertificateProvider("other", "x"), MESH)
    both.ClearField("tls_certificate_certificate_provider_instance")
    assert describe(tls_of(both)) == "no identity, ca mesh, SANs any"


def test_the_combined_context_and_its_deprecated_ca_instance() -> None:
    fallback = old_instance("old")
    default = Validation(ca_certificate_provider_instance=instance(),
                         match_subject_alt_names=[string_pb2.StringMatcher(exact="a")])
    combined = tls_pb2.CommonTlsContext(combined_validation_context=Combined(
        default_validation_context=default, validation_context_certificate_provider_instance=fallback))
    assert tls_of(combined, frozenset({"mesh"})) == UpstreamTls(None, MESH, (SanMatcher("exact", "a"),))
    default.ClearField("ca_certificate_provider_instance")  # the deprecated instance serves, SANs still the default's
    default.system_root_certs.SetInParent()  # (even over system root certs)
    combined.combined_validation_context.default_validation_context.CopyFrom(default)
    assert tls_of(combined, frozenset({"old"})) == UpstreamTls(None, CertificateProvider("old"),
                                                               (SanMatcher("exact", "a"),))


def test_system_root_certs_from_grpcio_1_73_or_with_grpcs_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    roots = tls_pb2.CommonTlsContext(validation_context=Validation(system_root_certs=Validation.SystemRootCerts()))
    monkeypatch.delenv(SYSTEM_ROOT_CERTS_ENV, raising=False)
    monkeypatch.setattr(grpc, "__version__", "1.73.0")
    assert tls_of(roots) == UpstreamTls(None, None)
    assert describe(tls_of(roots)) == "no identity, ca system root certs, SANs any"
    monkeypatch.setattr(grpc, "__version__", "1.72.2")
    assert rejected(roots) == [f"{AT}: no CA certs configured"]
    monkeypatch.setenv(SYSTEM_ROOT_CERTS_ENV, "Yes")
    assert tls_of(roots) == UpstreamTls(None, None)
    monkeypatch.setenv(SYSTEM_ROOT_CERTS_ENV, "false")
    assert rejected(roots) == [f"{AT}: no CA certs configured"]


@pytest.mark.parametrize("version, words", [("1.70.0", "invalid StringMatcher specified"),
                                            ("1.73.1", "invalid StringMatcher specified"),
                                            ("1.74.0", "invalid string matcher")])
def test_a_san_matcher_without_a_pattern_in_the_installed_grpcios_words(monkeypatch: pytest.MonkeyPatch,
                                                                       version: str, words: str) -> None:
    monkeypatch.setattr(grpc, "__version__", version)
    empty = tls_pb2.CommonTlsContext(validation_context=Validation(
        ca_certificate_provider_instance=instance(), match_subject_alt_names=[string_pb2.StringMatcher()]))
    assert rejected(empty) == [f"{AT}.validation_context.match_subject_alt_names[0]: {words}"]


def test_only_the_bootstraps_certificate_providers_may_be_named() -> None:
    common = tls_pb2.CommonTlsContext(tls_certificate_provider_instance=instance(),
                                      validation_context=Validation(ca_certificate_provider_instance=instance()))
    assert rejected(common, frozenset()) == [
        f"{AT}.tls_certificate_provider_instance.instance_name: unrecognized certificate provider instance name: mesh",
        f"{AT}.validation_context.ca_certificate_provider_instance.instance_name: unrecognized certificate provider "
        "instance name: mesh"]
    data = encoded(common)  # the client's DecodeContext carries its bootstrap's names to the check
    assert resources.CLUSTER.decode(data, resources.DecodeContext(frozenset({"mesh"})))[1].tls == UpstreamTls(MESH,
                                                                                                              MESH)
    with pytest.raises(ResourceError):
        resources.CLUSTER.decode(data, resources.DecodeContext())


def test_a_bad_regex_is_checked_before_ignore_case() -> None:
    def context(pattern: str) -> Any:
        return tls_pb2.CommonTlsContext(validation_context=Validation(
            ca_certificate_provider_instance=instance(), match_subject_alt_names=[string_pb2.StringMatcher(
                safe_regex=regex_pb2.RegexMatcher(regex=pattern), ignore_case=True)]))
    at = f"{AT}.validation_context.match_subject_alt_names[0]"
    assert rejected(context("a")) == [f"{at}.ignore_case: not supported for regex matcher"]
    (error,) = rejected(context("a(b"))
    assert error.startswith(f"{at}: Invalid regex string specified in matcher: ")
