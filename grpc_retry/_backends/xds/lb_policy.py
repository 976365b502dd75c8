"""Which load-balancing policy serves a cluster: the one it asks for where grpc_retry has it, else round_robin.
A cluster whose policy is replaced is told of once per channel (a WARNING on the `grpc_retry` logger), and
`xds-status` shows both, so the replacement is never silent."""

from __future__ import annotations

import logging
from typing import Collection, Dict

log = logging.getLogger("grpc_retry")

ROUND_ROBIN = "round_robin"
RING_HASH = "ring_hash"
# wrr_locality over round_robin is what EDS localities get anyway: each locality's share by its weight.
SERVED = frozenset({ROUND_ROBIN, f"wrr_locality({ROUND_ROBIN})", RING_HASH})


def in_force(asked: str) -> str:
    """The policy that serves a cluster asking for `asked` (a Cluster's lb_policy)."""
    return asked if asked in SERVED else ROUND_ROBIN


def subchannel_policy(asked: str) -> str:
    """The policy of the subchannels of a cluster asking for `asked`: ring_hash or round_robin."""
    return RING_HASH if in_force(asked) == RING_HASH else ROUND_ROBIN


class Replacements:
    """One channel's notices of replaced policies: one per cluster and the policy it asks for, while the config
    names the cluster (one that leaves and comes back is told of again)."""

    __slots__ = ("_told",)

    def __init__(self) -> None:
        self._told: Dict[str, str] = {}  # cluster name -> the policy it asked for, told of

    def note(self, cluster: str, asked: str) -> None:
        """The config names `cluster`, asking for `asked`: warn if that is replaced and not yet told of."""
        served = in_force(asked)
        if served == asked:
            self._told.pop(cluster, None)
        elif self._told.get(cluster) != asked:
            self._told[cluster] = asked
            log.warning("xDS cluster %r asks for the %s load-balancing policy, which grpc_retry does not have: "
                        "%s serves it", cluster, asked, served)

    def keep(self, clusters: Collection[str]) -> None:
        """Forget the clusters the config no longer names."""
        for name in [name for name in self._told if name not in clusters]:
            del self._told[name]
