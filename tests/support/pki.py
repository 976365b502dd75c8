"""Certificates for mesh TLS (gRFC A29), made with openssl: a CA and a rogue CA, a backend's certificate and client
certificates; the bootstrap's file_watcher certificate provider that serves them to a client, and a cluster's
UpstreamTlsContext that names that provider."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from support.xds_resources import packed

SERVER_ID = "spiffe://cluster.local/ns/default/sa/backend"  # in the backends' certificate
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/client"   # in the client certificate the CA signed
ROGUE_ID = "spiffe://cluster.local/ns/default/sa/rogue"     # in a client certificate another CA signed
PROVIDER = "mesh"  # the bootstrap's certificate provider instance that the clusters name


@dataclass(frozen=True)
class Pki:
    """PEM files in `folder`: `ca` and `rogue-ca` (self-signed); signed by ca: `server` (DNS localhost, IP
    127.0.0.1, SERVER_ID) and `client` (CLIENT_ID); signed by rogue-ca: `rogue` (ROGUE_ID). NAME.pem, NAME.key."""

    folder: Path

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"


def certificate(pki: Pki, name: str, issuer: Optional[str] = None, names: str = "") -> None:
    """NAME.pem and NAME.key in pki's folder: an EC P-256 certificate valid for a day, self-signed without `issuer`,
    else signed by it with subjectAltName `names`."""
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-keyout", str(pki.key(name)), "-out", str(pki.cert(name)), "-days", "1", "-subj", f"/CN={name}"]
    if issuer is not None:
        command += ["-CA", str(pki.cert(issuer)), "-CAkey", str(pki.key(issuer)),
                    "-addext", "basicConstraints=critical,CA:FALSE", "-addext", f"subjectAltName={names}"]
    subprocess.run(command, check=True, capture_output=True)


def make_pki(folder: Path) -> Pki:
    """Every certificate of Pki, made in `folder` (which exists)."""
    made = Pki(folder)
    certificate(made, "ca")
    certificate(made, "rogue-ca")
    certificate(made, "server", "ca", f"DNS:localhost,IP:127.0.0.1,URI:{SERVER_ID}")
    certificate(made, "client", "ca", f"URI:{CLIENT_ID}")
    certificate(made, "rogue", "rogue-ca", f"URI:{ROGUE_ID}")
    return made


def file_watcher(cert: Path, key: Path, ca: Path) -> Dict[str, Any]:
    """The bootstrap's certificate_providers: PROVIDER, a file_watcher read again every second."""
    return {PROVIDER: {"plugin_name": "file_watcher", "config": {
        "certificate_file": str(cert), "private_key_file": str(key), "ca_certificate_file": str(ca),
        "refresh_interval": "1s"}}}


def upstream_tls(san: Sequence[string_pb2.StringMatcher] = ()) -> base_pb2.TransportSocket:
    """A cluster's transport socket that asks for TLS: its identity certificate and its CA from PROVIDER, the
    backend's certificate to match one of `san` (none: any the CA signed)."""
    instance = common_pb2.CertificateProviderPluginInstance(instance_name=PROVIDER)
    context = tls_pb2.UpstreamTlsContext(common_tls_context=tls_pb2.CommonTlsContext(
        tls_certificate_provider_instance=instance,
        validation_context=common_pb2.CertificateValidationContext(ca_certificate_provider_instance=instance,
                                                                   match_subject_alt_names=list(san))))
    return base_pb2.TransportSocket(name="envoy.transport_sockets.tls", typed_config=packed(context))
