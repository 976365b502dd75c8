"""grpc_retry's xDS client: the bootstrap (bootstrap.py), read as gRPC's core reads it. All but bootstrap.py,
errors.py, status.py and this module need the `xds` extra (the envoy protos of `xds-protos`): without it an `xds:`
target goes whole to one grpcio channel, served by grpcio's own xDS client. So does a channel whose credentials are
grpc.xds_channel_credentials(...): the TLS its clusters ask for (gRFC A29) is grpcio's to make."""

from __future__ import annotations

import importlib.util
import logging
from typing import Optional

import grpc

from grpc_retry._transport import xds_credentials

_told = False  # (the notice below: once per process)


def own_client(target: str, credentials: Optional[grpc.ChannelCredentials]) -> bool:
    """Whether grpc_retry's own xDS client serves `target`: the extra's envoy protos are installed (looked up, not
    imported), and the credentials are not xDS credentials. Without the protos the target goes to grpcio's xDS
    client, as documented; that is said once, at DEBUG (GRPC_RETRY_TRACE=1 shows it), since it is no fault: a
    process on grpcio's xDS goes on as it did, and a drop-in channel makes no noise grpcio's would not.

    With xDS credentials a cluster's UpstreamTlsContext asks for TLS from the bootstrap's certificate providers,
    checked against its subject-alt-name matchers with no hostname check. grpcio's public API makes TLS channels
    that always check a hostname (a SPIFFE URI, the one name of a mesh workload's certificate, cannot be one), so
    grpc_retry's subchannels cannot honour it: grpcio's own xDS client serves the channel, and the mesh's TLS is
    exactly gRPC's, never plaintext."""
    global _told
    if credentials is not None and xds_credentials(credentials):
        logging.getLogger("grpc_retry").debug(
            "%s: xDS credentials: the channel goes whole to grpcio's own xDS client, which applies its clusters' "
            "TLS", target)
        return False
    if importlib.util.find_spec("envoy") is not None:
        return True
    if not _told:
        _told = True
        logging.getLogger("grpc_retry").debug(
            "%s goes whole to one grpcio channel and grpcio's own xDS client: grpc_retry's needs the xds extra "
            "(pip install 'grpc_retry[xds]')", target)
    return False
