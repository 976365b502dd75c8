"""What an `xds:` target is configured with, followed resource to resource (as gRPC's xDS dependency manager, gRFC
A74): its Listener, the RouteConfiguration it names or holds, the virtual host for the target's name, every
cluster its routes can send to (an aggregate cluster's children too, to its leaves: A37, A75), and each cluster's
endpoints. The whole is told to a listener each time any part changes and every part is known; a part that fails
is told as an error, the last whole config standing.

An aggregate cluster's leaves are its children in order, each aggregate child replaced by its own leaves, a
cluster met before left out (so a cycle ends), at most MAX_DEPTH clusters deep; with none, or deeper, the
aggregate has an error in place of its leaves (its calls fail with it), as gRPC's core words it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from grpc_retry._backends.xds import resources
from grpc_retry._backends.xds.client import Watcher, XdsClient
from grpc_retry._backends.xds.clusters import AGGREGATE

MAX_DEPTH = 16  # clusters from an aggregate to its deepest leaf, both counted, at most (as gRPC's core counts)


@dataclass(frozen=True)
class XdsConfig:
    """One complete configuration of a target."""

    listener: Any
    route_config: Any
    virtual_host: Any
    clusters: Mapping[str, Any]  # name -> Cluster
    endpoints: Mapping[str, Any]  # cluster name -> its ClusterLoadAssignment (None: it has none)
    aggregates: Mapping[str, Any] = field(default_factory=dict)  # aggregate cluster -> its leaves, or its error


class ConfigWatcher:
    """Follows one target's resources on `client`. `on_config(config)` hears each complete config,
    `on_error(message)` what stops one from being complete (the previous one, if any, stands), and `on_deleted`
    (if given; else `on_error`) that the Listener does not exist (never sent, or deleted): the target has no
    config then. Each runs on the client's thread, outside any lock of this object's."""

    def __init__(self, client: XdsClient, listener_name: str, authority: str,
                 on_config: Callable[[XdsConfig], None], on_error: Callable[[str], None],
                 on_deleted: Optional[Callable[[str], None]] = None) -> None:
        self._client = client
        self._authority = authority
        self._on_config, self._on_error = on_config, on_error
        self._on_deleted = on_error if on_deleted is None else on_deleted
        self._lock = threading.RLock()
        self._closed = False
        self._listener: Any = None
        self._route_name: Optional[str] = None
        self._route: Any = None
        self._clusters: Dict[str, Any] = {}  # watched cluster -> its resource (None until it comes)
        self._endpoints: Dict[str, Any] = {}  # watched EDS name -> its resource (None until it comes)
        self._missing: Set[Tuple[str, str]] = set()  # (type name, resource name) known not to exist
        self._watchers: Dict[Tuple[str, str], _Part] = {}
        self._pending: List[Callable[[], None]] = []
        with self._lock:
            self._watch(resources.LISTENER, listener_name)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            watchers, self._watchers = self._watchers, {}
        for (_, name), part in watchers.items():
            self._client.unwatch(part.kind, name, part)

    # -- what to watch ------------------------------------------------------------------------------------------

    def _watch(self, kind: resources.ResourceType, name: str) -> None:
        key = (kind.name, name)
        if key in self._watchers:
            return
        part = self._watchers[key] = _Part(self, kind)
        self._client.watch(kind, name, part)

    def _unwatch(self, kind: resources.ResourceType, name: str) -> None:
        part = self._watchers.pop((kind.name, name), None)
        self._missing.discard((kind.name, name))
        if part is not None:
            self._client.unwatch(kind, name, part)

    def _follow(self) -> None:
        """(Under the lock.) Watch what the current resources name, drop what they no longer do; then tell the
        listener the whole, if it is complete."""
        route_name = None if self._listener is None else self._listener.route_config_name
        if route_name != self._route_name:
            if self._route_name is not None:
                self._unwatch(resources.ROUTE_CONFIGURATION, self._route_name)
            self._route_name, self._route = route_name, None
            if route_name is not None:
                self._watch(resources.ROUTE_CONFIGURATION, route_name)
        route = self._listener.route_config if self._listener is not None and route_name is None else self._route
        host = None if route is None else route.virtual_host(self._authority)
        wanted = set() if host is None else set(host.cluster_names())
        reach = list(wanted)
        while reach:  # (an aggregate's children, to its leaves)
            cluster = self._clusters.get(reach.pop())
            if cluster is not None and cluster.kind == AGGREGATE:
                reach.extend(child for child in cluster.children if child not in wanted)
                wanted.update(cluster.children)
        for name in set(self._clusters) - wanted:
            cluster = self._clusters.pop(name)
            self._unwatch(resources.CLUSTER, name)
            if cluster is not None:
                self._drop_endpoints(_eds_name(name, cluster))
        for name in wanted - set(self._clusters):
            self._clusters[name] = None
            self._watch(resources.CLUSTER, name)
        for name, cluster in self._clusters.items():
            eds_name = _eds_name(name, cluster)
            if eds_name is not None and eds_name not in self._endpoints:
                self._endpoints[eds_name] = None
                self._watch(resources.CLUSTER_LOAD_ASSIGNMENT, eds_name)
        self._complete(route, host)

    def _drop_endpoints(self, eds_name: Optional[str]) -> None:
        if eds_name is None:
            return
        if any(_eds_name(n, c) == eds_name for n, c in self._clusters.items()):
            return  # another cluster still uses them
        self._endpoints.pop(eds_name, None)
        self._unwatch(resources.CLUSTER_LOAD_ASSIGNMENT, eds_name)

    def _complete(self, route: Any, host: Any) -> None:
        if self._listener is None or route is None:
            return
        if host is None:
            self._tell_error(f"no virtual host in RouteConfiguration {route.name!r} for {self._authority!r}")
            return
        if any(c is None and (resources.CLUSTER.name, n) not in self._missing for n, c in self._clusters.items()):
            return  # a cluster has not come yet
        endpoints: Dict[str, Any] = {}
        for name, cluster in self._clusters.items():
            if cluster is None:
                continue  # it does not exist: calls routed to it fail
            eds_name = _eds_name(name, cluster)
            if eds_name is None:  # LOGICAL_DNS or aggregate: no ClusterLoadAssignment
                endpoints[name] = None
                continue
            assignment = self._endpoints.get(eds_name)
            if assignment is None and (resources.CLUSTER_LOAD_ASSIGNMENT.name, eds_name) not in self._missing:
                return  # its endpoints have not come yet
            endpoints[name] = assignment
        aggregates = {name: self._leaves(name) for name, cluster in self._clusters.items()
                      if cluster is not None and cluster.kind == AGGREGATE}
        config = XdsConfig(self._listener, route, host, {n: c for n, c in self._clusters.items() if c is not None},
                           endpoints, aggregates)
        self._tell(lambda: self._on_config(config))

    def _leaves(self, name: str) -> Any:
        """(Under the lock.) An aggregate cluster's leaf clusters in priority order, or its error (a str)."""
        leaves: List[str] = []
        seen: Set[str] = set()

        def visit(at: str, depth: int) -> Optional[str]:
            if at in seen:
                return None
            seen.add(at)
            if depth >= MAX_DEPTH:
                return "aggregate cluster graph exceeds max depth"
            cluster = self._clusters.get(at)
            if cluster is None or cluster.kind != AGGREGATE:
                if cluster is not None:  # (one that does not exist has nothing to give)
                    leaves.append(at)
                return None
            return next((error for error in (visit(child, depth + 1) for child in cluster.children) if error), None)
        error = visit(name, 0)
        if error is None and not leaves:
            error = f"aggregate cluster dependency graph for {name} has no leaf clusters"
        return error or tuple(leaves)

    def _tell_error(self, message: str) -> None:
        self._tell(lambda: self._on_error(message))

    def _tell(self, what: Callable[[], None]) -> None:
        """(Under the lock.) Told once the lock is released (_flush)."""
        self._pending.append(what)

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            if self._closed:
                return
        for what in pending:
            what()

    # -- what the client says -----------------------------------------------------------------------------------

    def _resource(self, kind: resources.ResourceType, name: str, value: Any) -> None:
        try:
            self._on_resource(kind, name, value)
        finally:
            self._flush()

    def _on_resource(self, kind: resources.ResourceType, name: str, value: Any) -> None:
        with self._lock:
            if self._closed or (kind.name, name) not in self._watchers:
                return
            self._missing.discard((kind.name, name))
            if kind is resources.LISTENER:
                self._listener = value
            elif kind is resources.ROUTE_CONFIGURATION:
                self._route = value
            elif kind is resources.CLUSTER:
                self._clusters[name] = value
            else:
                self._endpoints[name] = value
            self._follow()

    def _does_not_exist(self, kind: resources.ResourceType, name: str) -> None:
        try:
            self._on_does_not_exist(kind, name)
        finally:
            self._flush()

    def _on_does_not_exist(self, kind: resources.ResourceType, name: str) -> None:
        with self._lock:
            if self._closed or (kind.name, name) not in self._watchers:
                return
            self._missing.add((kind.name, name))
            if kind is resources.LISTENER:
                self._listener = None
                self._follow()
                message = f"LDS resource {name}: does not exist"  # grpcio's words
                self._tell(lambda: self._on_deleted(message))
            elif kind is resources.ROUTE_CONFIGURATION:
                self._route = None
                self._tell_error(f"RouteConfiguration {name!r} does not exist")
            elif kind is resources.CLUSTER:
                cluster = self._clusters.get(name)
                self._clusters[name] = None
                if cluster is not None:
                    self._drop_endpoints(_eds_name(name, cluster))
                self._follow()
            else:
                self._endpoints[name] = None
                self._follow()

    def _error(self, kind: resources.ResourceType, name: str, error: str) -> None:
        with self._lock:
            self._tell_error(f"{kind.name} {name!r}: {error}")
        self._flush()


def _eds_name(name: str, cluster: Any) -> Optional[str]:
    """The ClusterLoadAssignment an EDS cluster's endpoints come from (None: none, or not an EDS cluster)."""
    if cluster is None or cluster.kind != "EDS":
        return None
    return cluster.eds_name or name


class _Part(Watcher):
    """The watcher of one resource of a ConfigWatcher."""

    def __init__(self, owner: ConfigWatcher, kind: resources.ResourceType) -> None:
        self._owner, self.kind = owner, kind

    def on_resource(self, name: str, value: Any) -> None:
        self._owner._resource(self.kind, name, value)

    def on_does_not_exist(self, name: str) -> None:
        self._owner._does_not_exist(self.kind, name)

    def on_error(self, name: str, error: str) -> None:
        self._owner._error(self.kind, name, error)
