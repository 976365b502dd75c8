"""grpc_retry's xDS client: the bootstrap (bootstrap.py), read as gRPC's core reads it. All but bootstrap.py,
errors.py, status.py and this module need the `xds` extra (the envoy protos of `xds-protos`): without it an `xds:`
target goes whole to one grpcio channel, served by grpcio's own xDS client."""

from __future__ import annotations

import importlib.util
import logging

_told = False  # (the notice below: once per process)


def own_client(target: str) -> bool:
    """Whether grpc_retry's own xDS client serves `target`: the extra's envoy protos are installed (looked up, not
    imported). Without them the target goes to grpcio's xDS client, as documented; that is said once, at DEBUG
    (GRPC_RETRY_TRACE=1 shows it), since it is no fault: a process on grpcio's xDS goes on as it did, and a drop-in
    channel makes no noise grpcio's would not."""
    global _told
    if importlib.util.find_spec("envoy") is not None:
        return True
    if not _told:
        _told = True
        logging.getLogger("grpc_retry").debug(
            "%s goes whole to one grpcio channel and grpcio's own xDS client: grpc_retry's needs the xds extra "
            "(pip install 'grpc_retry[xds]')", target)
    return False
