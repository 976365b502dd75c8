"""Whether a channel's calls take a route each: a target whose scheme names a control plane that grpc_retry serves
itself (`xds:`, with the `xds` extra and credentials other than xDS ones) gets that plane's router, which picks
per call the route, its cluster's subchannels and the route's retry policy (xds/router.py; gRPC's ConfigSelector
plays that part). Any other target has one set of subchannels (subchannels.py) — an `xds:` target too where it goes
whole to grpcio's own xDS client."""

from __future__ import annotations

from typing import Any, Callable, Optional

import grpc

from grpc_retry._options import RetryOptions


def router_for(target: Any, options: RetryOptions, credentials: Optional[grpc.ChannelCredentials],
               make: Callable[[Any, RetryOptions], Any], where: Callable[[], Callable[[Callable[[], None]], None]],
               aside: Optional[Callable[[Callable[[], None]], Any]] = None) -> Optional[Any]:
    """The router of `target`'s calls, or None: the channel's own subchannels take them. `make(where, options)`
    makes a cluster's subchannels; `where()` says where the router applies a config; `aside` runs a cluster's
    close off the thread that ended its last call."""
    if not (isinstance(target, str) and target.startswith("xds:")):
        return None
    from grpc_retry._backends.xds import own_client

    if not own_client(target, credentials):
        return None
    from grpc_retry._backends.xds.router import XdsRouter  # (the envoy protos: only once the extra is found)

    return XdsRouter(target, options, make, where, aside)


def notes_for(target: Any, credentials: Optional[grpc.ChannelCredentials]) -> Optional[Callable[[str], str]]:
    """What the subchannels of a channel without a router add to the details of a connection failure: for an
    `xds:` target grpcio's xDS client serves, what its certificate providers could not read."""
    if not (isinstance(target, str) and target.startswith("xds:")):
        return None
    from grpc_retry._backends.xds.certificates import notes

    return notes(credentials)
