"""A Cluster's transport socket (gRFC A29): the UpstreamTlsContext its connections ask for, checked as gRPC's core
checks it whatever the channel's credentials (xds_cluster_parser.cc UpstreamTlsContextParse, xds_common_types_parser.cc
CommonTlsContextParse). What the core rejects is rejected with its field and words; what it ignores (sni,
auto_host_sni, allow_renegotiation, max_session_keys, alpn_protocols, trusted_ca, watched_directory,
allow_expired_certificate, trust_chain_verification, match_typed_subject_alt_names, the socket's name) is ignored.
The value says which of the bootstrap's certificate providers give the client's certificate and the CA, and which
subject alt names the server's certificate must have; grpcio's own client applies it under xDS credentials."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import AbstractSet, Any, Optional, Tuple

import grpc
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from grpc_retry._backends.xds.errors import Errors, type_name
from grpc_retry._version import grpcio_minor

UPSTREAM_TLS_CONTEXT = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
# gRFC A82: grpcio takes a validation context's system_root_certs from 1.73, before that only with this switch true
SYSTEM_ROOT_CERTS_ENV = "GRPC_EXPERIMENTAL_XDS_SYSTEM_ROOT_CERTS"
MATCHER_KINDS = ("exact", "prefix", "suffix", "contains", "safe_regex")
_TYPED_STRUCTS = ("xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct")
_TRUE = ("1", "t", "true", "y", "yes")  # gRPC's gpr_parse_bool_value (any case)


@dataclass(frozen=True)
class CertificateProvider:
    """A certificate provider instance of the bootstrap (`certificate_providers`), and the certificate a cluster
    asks of it ("": its default)."""

    instance: str
    certificate_name: str = ""

    def __str__(self) -> str:
        return f"{self.instance} (certificate {self.certificate_name})" if self.certificate_name else self.instance


@dataclass(frozen=True)
class SanMatcher:
    """One of `match_subject_alt_names`: the server's certificate must have a subject alt name one of them
    matches."""

    kind: str  # exact, prefix, suffix, contains or safe_regex
    value: str
    ignore_case: bool = False

    def __str__(self) -> str:
        return f"{self.kind} {self.value}{' (ignore case)' if self.ignore_case else ''}"


@dataclass(frozen=True)
class UpstreamTls:
    """The TLS a cluster's connections ask for: the client's certificate (None: it presents none), what checks the
    server's (None: the system's root certificates), and the SAN matchers (none: any certificate the CA signed)."""

    identity: Optional[CertificateProvider]
    ca: Optional[CertificateProvider]
    san_matchers: Tuple[SanMatcher, ...] = ()

    def __str__(self) -> str:
        identity = f"identity {self.identity}" if self.identity is not None else "no identity"
        ca = f"ca {self.ca}" if self.ca is not None else "ca system root certs"
        sans = " or ".join(str(matcher) for matcher in self.san_matchers) or "any"
        return f"{identity}, {ca}, SANs {sans}"


# A validation context's CA instance, system root certs and SAN matchers
_Validation = Tuple[Optional[CertificateProvider], bool, Tuple[SanMatcher, ...]]
# A common context's identity, then its validation context's
_Common = Tuple[Optional[CertificateProvider], Optional[CertificateProvider], bool, Tuple[SanMatcher, ...]]


def describe(tls: Optional[UpstreamTls]) -> str:
    """What xds-status shows of a cluster's TLS."""
    return "plaintext" if tls is None else str(tls)


def parse(socket: Any, providers: AbstractSet[str], errors: Errors) -> Optional[UpstreamTls]:
    """The cluster's `transport_socket` (a TransportSocket); None, with the errors recorded, if gRPC rejects it.
    `providers`: the names of the bootstrap's certificate providers, the only instances a cluster may name."""
    at = "transport_socket.typed_config"
    if not socket.HasField("typed_config"):
        errors.add(at, "field not present")
        return None
    kind, at, data = _extension(socket.typed_config.type_url, socket.typed_config.value, at, errors)
    if kind is None:
        return None
    if kind != UPSTREAM_TLS_CONTEXT:
        errors.add(f"{at}.type_url", "unsupported transport socket type")
        return None
    if data is None:  # (a TypedStruct: its value is JSON, from which the core reads no UpstreamTlsContext)
        errors.add(at, "can't decode UpstreamTlsContext")
        return None
    try:
        context = tls_pb2.UpstreamTlsContext.FromString(data)
    except Exception:  # noqa: BLE001 (protobuf's DecodeError and its kin)
        errors.add(at, "can't decode UpstreamTlsContext")
        return None
    at += ".common_tls_context"
    before = errors.count()
    common: _Common = (None, None, False, ())
    if context.HasField("common_tls_context"):
        common = _common(context.common_tls_context, at, providers, errors)
    identity, ca, system_roots, sans = common
    if ca is None and not system_roots:
        errors.add(at, "no CA certs configured")
    return UpstreamTls(identity, ca, sans) if errors.count() == before else None


def _extension(url: str, data: bytes, at: str, errors: Errors) -> Tuple[Optional[str], str, Optional[bytes]]:
    """The core's ExtractXdsExtension: the type an Any holds (None: none can be told), the field path its value's
    errors go under, and its bytes (None for a TypedStruct, whose value is JSON)."""
    kind = _type_name(url, f"{at}.type_url", errors)
    if kind is None:
        return None, at, None
    at = f"{at}.value[{kind}]"
    if kind not in _TYPED_STRUCTS:
        return kind, at, data
    from xds.type.v3 import typed_struct_pb2

    try:
        struct = typed_struct_pb2.TypedStruct.FromString(data)
    except Exception:  # noqa: BLE001
        errors.add(at, "could not parse")
        return None, at, None
    kind = _type_name(struct.type_url, f"{at}.type_url", errors)
    return kind, f"{at}.value[{kind}]", None


def _type_name(url: str, at: str, errors: Errors) -> Optional[str]:
    """As type_name(), but a URL without a type is that whole URL's (the error said), as the core reads it here."""
    return type_name(url, at, errors) or url or None


def _common(common: Any, at: str, providers: AbstractSet[str], errors: Errors) -> _Common:
    """A CommonTlsContext: (identity, CA instance, system root certs, SAN matchers)."""
    validation: _Validation = (None, False, ())
    source = common.WhichOneof("validation_context_type")
    if source == "combined_validation_context":
        combined = common.combined_validation_context
        where = f"{at}.combined_validation_context"
        if combined.HasField("default_validation_context"):
            validation = _validation(combined.default_validation_context, f"{where}.default_validation_context",
                                     providers, errors)
        # (The deprecated instance serves when the default context names none, even over system root certs.)
        if validation[0] is None and combined.HasField("validation_context_certificate_provider_instance"):
            validation = (_provider(combined.validation_context_certificate_provider_instance,
                                    f"{where}.validation_context_certificate_provider_instance", providers, errors),
                          False, validation[2])
    elif source == "validation_context":
        validation = _validation(common.validation_context, f"{at}.validation_context", providers, errors)
    elif source == "validation_context_sds_secret_config":
        errors.add(f"{at}.validation_context_sds_secret_config", "feature unsupported")
    identity: Optional[CertificateProvider] = None
    if common.HasField("tls_certificate_provider_instance"):
        identity = _provider(common.tls_certificate_provider_instance, f"{at}.tls_certificate_provider_instance",
                             providers, errors)
    elif common.HasField("tls_certificate_certificate_provider_instance"):  # (deprecated: the core still reads it)
        identity = _provider(common.tls_certificate_certificate_provider_instance,
                             f"{at}.tls_certificate_certificate_provider_instance", providers, errors)
    else:
        for field in ("tls_certificates", "tls_certificate_sds_secret_configs"):
            if len(getattr(common, field)):
                errors.add(f"{at}.{field}", "feature unsupported")
    for field in ("tls_params", "custom_handshaker"):
        if common.HasField(field):
            errors.add(f"{at}.{field}", "feature unsupported")
    return (identity, *validation)


def _validation(context: Any, at: str, providers: AbstractSet[str], errors: Errors) -> _Validation:
    """A CertificateValidationContext: (CA instance, system root certs, SAN matchers)."""
    sans = []
    for i, matcher in enumerate(context.match_subject_alt_names):
        san = _san(matcher, f"{at}.match_subject_alt_names[{i}]", errors)
        if san is not None:
            sans.append(san)
    ca: Optional[CertificateProvider] = None
    system_roots = False
    if context.HasField("ca_certificate_provider_instance"):
        ca = _provider(context.ca_certificate_provider_instance, f"{at}.ca_certificate_provider_instance",
                       providers, errors)
    elif context.HasField("system_root_certs"):
        system_roots = system_root_certs_enabled()
    for field in ("verify_certificate_spki", "verify_certificate_hash"):
        if len(getattr(context, field)):
            errors.add(f"{at}.{field}", "feature unsupported")
    if context.require_signed_certificate_timestamp.value:
        errors.add(f"{at}.require_signed_certificate_timestamp", "feature unsupported")
    for field in ("crl", "custom_validator_config"):
        if context.HasField(field):
            errors.add(f"{at}.{field}", "feature unsupported")
    return ca, system_roots, tuple(sans)


def _provider(instance: Any, at: str, providers: AbstractSet[str], errors: Errors) -> CertificateProvider:
    """A CertificateProviderPluginInstance (or the deprecated CertificateProviderInstance: the same fields)."""
    if instance.instance_name not in providers:
        errors.add(f"{at}.instance_name", f"unrecognized certificate provider instance name: "
                                          f"{instance.instance_name}")
    return CertificateProvider(instance.instance_name, instance.certificate_name)


def _san(matcher: Any, at: str, errors: Errors) -> Optional[SanMatcher]:
    """One of match_subject_alt_names (the core's StringMatcherParse); None, with the error recorded, if rejected."""
    kind = matcher.WhichOneof("match_pattern")
    if kind not in MATCHER_KINDS:
        errors.add(at, "invalid string matcher" if grpcio_minor(grpc.__version__) >= (1, 74)
                   else "invalid StringMatcher specified")
        return None
    if kind != "safe_regex":
        return SanMatcher(kind, getattr(matcher, kind), matcher.ignore_case)
    pattern = matcher.safe_regex.regex
    # (Python's re stands in for RE2: alike on common syntax, but re takes backreferences and lookaround, which
    # RE2 rejects, and its error words after the core's prefix differ.)
    try:
        re.compile(pattern)
    except re.error as error:
        errors.add(at, f"Invalid regex string specified in matcher: {error}")
        return None
    if matcher.ignore_case:
        errors.add(f"{at}.ignore_case", "not supported for regex matcher")
    return SanMatcher(kind, pattern, matcher.ignore_case)


def system_root_certs_enabled() -> bool:
    """Whether a validation context's system_root_certs is a CA source (else ignored), as the installed grpcio
    reads it: always from 1.73, before that only with GRPC_EXPERIMENTAL_XDS_SYSTEM_ROOT_CERTS true."""
    return grpcio_minor(grpc.__version__) >= (1, 73) or os.environ.get(SYSTEM_ROOT_CERTS_ENV, "").lower() in _TRUE
