"""What grpcio does not say when a cluster's TLS cannot be made: grpcio's xDS client, serving a channel made with
xDS credentials, fails its calls UNAVAILABLE with "Failed to create security handshaker" when a certificate
provider has no certificate to give. notes() adds which provider and which of its files cannot be read."""

from __future__ import annotations

import os
from typing import Callable, List, Optional

import grpc

from grpc_retry._backends.xds.bootstrap import BootstrapError, load
from grpc_retry._transport import xds_credentials

NO_HANDSHAKER = "Failed to create security handshaker"  # grpcio's words
_FILES = ("certificate_file", "private_key_file", "ca_certificate_file")


def unreadable() -> List[str]:
    """Each file of the bootstrap's file_watcher providers that cannot be read now, with the provider and why."""
    try:
        providers = load().certificate_providers
    except BootstrapError:  # (grpcio's client says what is wrong with it)
        return []
    found = []
    for name, (plugin, config) in sorted(providers.items()):
        for key in _FILES if plugin == "file_watcher" else ():
            path = config.get(key)
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as error:
                found.append(f"certificate provider {name!r}: {key} {path!r}: {os.strerror(error.errno or 0)}")
    return found


def explain(details: str) -> str:
    """An attempt's details, with the providers' unreadable files after grpcio's words when those are why."""
    if NO_HANDSHAKER not in details:
        return details
    files = unreadable()
    return f"{details} ({'; '.join(files)})" if files else details


def notes(credentials: Optional[grpc.ChannelCredentials]) -> Optional[Callable[[str], str]]:
    """What explains the failures of an xds: target's channel served whole by grpcio: explain() under xDS
    credentials (nothing else makes TLS from the bootstrap's providers), else nothing."""
    return explain if credentials is not None and xds_credentials(credentials) else None
