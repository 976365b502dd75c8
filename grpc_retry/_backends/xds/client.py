"""grpc_retry's ADS client (state of the world, xDS v3; gRFCs A27, A46, A57): one stream per management server per
process, shared by every channel that watches its resources, on a thread of its own.

- Subscriptions per resource type; each response's resources are decoded and checked (resources.py). A response
  with any rejected resource is NACKed with the errors and the version last ACKed; its valid resources are used
  all the same, and a rejected one keeps serving its last good value (A46).
- A resource not received within DOES_NOT_EXIST_TIMEOUT of the request that asked for it on a stream does not
  exist. A Listener or Cluster missing from a response is deleted, unless the server is trusted with
  `ignore_resource_deletion` (A57).
- A stream that ends is started again after a backoff (none after a stream that had a response, A57); the cache
  and the versions are kept, and every subscription is sent again. Watchers hear an error only while the stream has
  given no response: its failure, or its channel failing to connect.
- The stream waits for its channel to connect (wait for ready), and the channel tries again at least every
  RECONNECT_MAX_S: a management server that comes back is followed within about a second, however long it was away.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

import grpc

from grpc_retry._backends.xds import hash_policy
from grpc_retry._backends.xds.bootstrap import Node, XdsServer
from grpc_retry._backends.xds.errors import ResourceError
from grpc_retry._backends.xds.lb_policy import RING_HASH, in_force
from grpc_retry._backends.xds.load_report import LoadReporter
from grpc_retry._backends.xds.resources import CLUSTER, ROUTE_CONFIGURATION, TYPES, DecodeContext, ResourceType
from grpc_retry._backends.xds.upstream_tls import describe
from grpc_retry._core import RING_SIZE_CAP
from grpc_retry._timer import TIMERS
from grpc_retry._transport import transport as internals

log = logging.getLogger("grpc_retry")

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DOES_NOT_EXIST_TIMEOUT = 15.0  # A57
BACKOFF = (1.0, 1.6, 120.0, 0.2)  # initial, multiplier, cap, jitter: gRPC's connection backoff
RECONNECT_MAX_S = 0.5  # the channel's reconnect backoff, at most (before grpcio's 20% jitter)
_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", int(RECONNECT_MAX_S * 500)),
                    ("grpc.max_reconnect_backoff_ms", int(RECONNECT_MAX_S * 1000)))
_FOLLOW_S = 0.2  # how long the follower waits for a change before it looks whether the client closed
_STATES = {state.value[0]: state for state in grpc.ChannelConnectivity}
_RESOURCE_WRAPPER = "type.googleapis.com/envoy.service.discovery.v3.Resource"
_END = object()

# A resource's status, as xds-status shows it
REQUESTED, ACKED, NACKED, DOES_NOT_EXIST = "requested", "acked", "nacked", "does not exist"


class Watcher:
    """What a resource's watcher is told (on the client's thread: it must not block)."""

    def on_resource(self, name: str, value: Any) -> None:
        """A new value of the resource."""

    def on_does_not_exist(self, name: str) -> None:
        """The resource does not exist (never sent, or deleted)."""

    def on_error(self, name: str, error: str) -> None:
        """The management server cannot be reached or rejected what it sent; the last value (if any) stands."""


@dataclass
class Resource:
    """What the client holds of one resource."""

    status: str = REQUESTED
    value: Any = None
    version: str = ""  # of the value
    raw: bytes = b""
    error: str = ""  # why the last update was rejected
    updated: float = 0.0  # time.time() of the last change
    watchers: List[Watcher] = field(default_factory=list)
    timer: Any = None  # the does-not-exist timer


@dataclass
class _Type:
    """One type's subscription: its resources, the version last ACKed and the nonce last seen."""

    kind: ResourceType
    resources: Dict[str, Resource] = field(default_factory=dict)
    version: str = ""
    nonce: str = ""


def _key(server: XdsServer, certificate_providers: Iterable[str]) -> Tuple[str, str, FrozenSet[str]]:
    """Which of the process's clients serves a channel: one per server and set of certificate providers."""
    return server.server_uri, server.channel_creds, frozenset(certificate_providers)


class XdsClient:
    """The client of one management server. `acquire()` gives the process's (made on first use), `release()` gives
    it back: the last release closes its stream and thread. `certificate_providers`: the names of the bootstrap's
    certificate providers, which a Cluster's TLS is checked against (as gRPC's core does, whatever the channels'
    credentials)."""

    _clients: Dict[Tuple[str, str, FrozenSet[str]], XdsClient] = {}
    _clients_lock = threading.Lock()

    def __init__(self, server: XdsServer, node: Node, channel: Optional[grpc.Channel] = None,
                 timeout: float = DOES_NOT_EXIST_TIMEOUT, certificate_providers: Iterable[str] = ()) -> None:
        self.server = server
        self._node = node
        self._context = DecodeContext(frozenset(certificate_providers))
        self._key = _key(server, self._context.certificate_providers)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._types: Dict[str, _Type] = {}
        self._users = 0
        self._closed = False
        self._wake = threading.Event()
        self._outbox: Optional[queue.Queue[Any]] = None  # the live stream's requests
        self._call: Any = None
        self._writers: List[threading.Thread] = []  # grpcio's threads that send each stream's requests
        self._responded = False  # the live stream has given a response
        self._first = True  # the next request is its stream's first (it carries the node)
        self._told = False  # the live stream's watchers heard that its channel cannot connect
        self._failure: Optional[str] = None  # what the watchers were last told of the server, until it responds
        self._state = grpc.ChannelConnectivity.IDLE  # the channel's, last told
        self._channel = channel if channel is not None else _channel_to(server)
        self._reporter: Optional[LoadReporter] = None  # its LRS stream's, once a cluster reports here
        self._thread = threading.Thread(target=self._run, name=f"grpc_retry-xds-{server.server_uri}", daemon=True)
        self._thread.start()
        # (A thread of its own rather than grpcio's subscribe(): close() knows it has stopped watching before it
        # closes the channel, where grpcio's watcher can still be on its way to a closed channel, and fail there.)
        self._follower = threading.Thread(target=self._follow, name=f"grpc_retry-xds-{server.server_uri}-state",
                                          daemon=True)
        self._follower.start()

    @classmethod
    def acquire(cls, server: XdsServer, node: Node, certificate_providers: Iterable[str] = ()) -> XdsClient:
        # (Its checks depend on the certificate providers: a bootstrap naming others gets a client of its own.)
        key = _key(server, certificate_providers)
        with cls._clients_lock:
            client = cls._clients.get(key)
            if client is None:
                client = cls._clients[key] = XdsClient(server, node, certificate_providers=key[2])
            client._users += 1
            return client

    def release(self) -> None:
        with XdsClient._clients_lock:
            self._users -= 1
            if self._users > 0:
                return
            if XdsClient._clients.get(self._key) is self:
                del XdsClient._clients[self._key]
        self.close()

    # -- watches ------------------------------------------------------------------------------------------------

    def watch(self, kind: ResourceType, name: str, watcher: Watcher) -> None:
        """Watch a resource: the watcher hears its value at once if it is held, then every change."""
        tell: List[Callable[[], None]] = []
        with self._lock:
            subscription = self._types.setdefault(kind.url, _Type(kind))
            resource = subscription.resources.get(name)
            if resource is None:
                resource = subscription.resources[name] = Resource(updated=time.time())
                self._subscribe(subscription)
                self._start_timer(kind, name, resource)
            resource.watchers.append(watcher)
            if resource.value is not None:
                tell.append(lambda: watcher.on_resource(name, resource.value))
            elif resource.status == DOES_NOT_EXIST:
                tell.append(lambda: watcher.on_does_not_exist(name))
            elif self._failure is not None:  # (as the watchers before it were told)
                tell.append(_bound(watcher.on_error, name, self._failure))
        _run(tell)

    def unwatch(self, kind: ResourceType, name: str, watcher: Watcher) -> None:
        with self._lock:
            subscription = self._types.get(kind.url)
            resource = subscription.resources.get(name) if subscription is not None else None
            if subscription is None or resource is None or watcher not in resource.watchers:
                return
            resource.watchers.remove(watcher)
            if not resource.watchers:  # no one watches it: unsubscribed, forgotten
                del subscription.resources[name]
                if resource.timer is not None:
                    resource.timer.cancel()
                self._subscribe(subscription)

    def snapshot(self) -> List[Dict[str, Any]]:
        """Every resource held: type, name, status, version, error, last update; for a Cluster the TLS and the
        LB policy of the value it serves, with the policy in force; for a RouteConfiguration its routes' hash
        policies (xds-status)."""
        with self._lock:
            return [{"server": self.server.server_uri, "type": t.kind.name, "name": name, "status": r.status,
                     "version": r.version, "error": r.error, "updated": r.updated,
                     **_parts(t.kind, r.value, self._reporter)}
                    for t in self._types.values() for name, r in sorted(t.resources.items())]

    def reporter(self) -> LoadReporter:
        """The load reporter of this server (LRS), for the clusters whose lrs_server is it."""
        with self._lock:
            if self._reporter is None:
                self._reporter = LoadReporter(self._channel, self._node)
            return self._reporter

    def close(self) -> None:
        with self._lock:
            reporter = self._reporter
        if reporter is not None:
            reporter.close()
        with self._lock:
            self._closed = True
            for subscription in self._types.values():
                for resource in subscription.resources.values():
                    if resource.timer is not None:
                        resource.timer.cancel()
            call, outbox = self._call, self._outbox
        if outbox is not None:
            outbox.put(_END)
        if call is not None:
            call.cancel()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        for writer in list(self._writers):  # nothing of the stream outlives its client
            writer.join(5)
        if threading.current_thread() is not self._follower:
            self._follower.join(5)
        internals.close_sync_channel(self._channel)

    # -- the stream ---------------------------------------------------------------------------------------------

    def _run(self) -> None:
        attempt_delay = BACKOFF[0]
        while True:
            with self._lock:
                if self._closed:
                    return
                outbox: queue.Queue[Any] = queue.Queue()
                self._outbox, self._responded, self._first, self._told = outbox, False, True, False
                for subscription in self._types.values():
                    subscription.nonce = ""  # (a nonce is its stream's)
                    self._subscribe(subscription)
                    for name, resource in subscription.resources.items():
                        self._start_timer(subscription.kind, name, resource)
                failing = self._cannot_connect()  # (a channel already failing may not say so again)
            _run(failing)
            stream: Any = self._channel.stream_stream(
                ADS_METHOD, request_serializer=_serialized, response_deserializer=_response)
            error = "the stream ended"
            try:
                call = stream(_requests(outbox, self._writers), wait_for_ready=True)
                with self._lock:
                    self._call, closed = call, self._closed
                if closed:  # closed while the stream started
                    call.cancel()
                for response in call:
                    self._on_response(response)
            except grpc.RpcError as failure:
                error = f"{failure.code().name}: {failure.details()}"
            except Exception as failure:  # noqa: BLE001 (the thread must go on: it serves every channel)
                log.exception("grpc_retry: the xDS client's stream failed")
                error = repr(failure)
            outbox.put(_END)  # the stream's writer ends with it
            tell: List[Callable[[], None]] = []
            with self._lock:
                self._outbox, self._call = None, None
                if self._closed:
                    return
                responded = self._responded
                for subscription in self._types.values():
                    for resource in subscription.resources.values():
                        if resource.timer is not None:  # started again with the next stream's request
                            resource.timer.cancel()
                            resource.timer = None
                if not responded:
                    tell = self._errors(error)
            _run(tell)
            delay = 0.0 if responded else attempt_delay * random.uniform(1 - BACKOFF[3], 1 + BACKOFF[3])
            attempt_delay = BACKOFF[0] if responded else min(attempt_delay * BACKOFF[1], BACKOFF[2])
            self._wake.wait(delay)
            self._wake.clear()

    def _follow(self) -> None:
        """(Its own thread, until close.) Tell _on_connectivity the channel's state, then each change of it, having
        started its connection."""
        state = internals.sync_connectivity(self._channel, True)
        while True:
            self._on_connectivity(_STATES[state])  # (which may close the client)
            while not self._closed and not internals.sync_watch_connectivity(self._channel, state, _FOLLOW_S):
                pass
            if self._closed:
                return
            state = internals.sync_connectivity(self._channel, False)

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        """(The follower's thread.) A channel that fails to connect is an error for the watchers of a stream that has
        had no response yet, once a stream (the stream itself waits on)."""
        with self._lock:
            self._state = state
            tell = self._cannot_connect()
        _run(tell)

    def _cannot_connect(self) -> List[Callable[[], None]]:
        """(Under the lock.) The errors to tell if the channel fails to connect for a stream not yet told."""
        if self._state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE or self._closed or self._outbox is None \
                or self._responded or self._told:
            return []
        self._told = True
        return self._errors("cannot connect (its channel is in TRANSIENT_FAILURE)")

    def _errors(self, error: str) -> List[Callable[[], None]]:
        """(Under the lock.) Telling every watcher that the server is not serving them: `error`."""
        message = self._failure = f"xDS server {self.server.server_uri}: {error}"
        return [_bound(w.on_error, name, message) for subscription in self._types.values()
                for name, resource in subscription.resources.items() for w in resource.watchers]

    def _subscribe(self, subscription: _Type, error: Optional[str] = None) -> None:
        """(Under the lock.) Send the type's subscription (an ACK, or with `error` a NACK) on the live stream."""
        if self._outbox is None:
            return
        from envoy.service.discovery.v3 import discovery_pb2
        from google.rpc import status_pb2

        request = discovery_pb2.DiscoveryRequest(
            version_info=subscription.version, resource_names=sorted(subscription.resources),
            type_url=subscription.kind.url, response_nonce=subscription.nonce)
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                            message=error))
        if self._first:
            request.node.CopyFrom(_node_message(self._node))
            self._first = False
        self._outbox.put(request)

    def _start_timer(self, kind: ResourceType, name: str, resource: Resource) -> None:
        """(Under the lock.) A57: the resource, asked for on a live stream, does not exist if it is not sent in
        time (one held already needs no timer)."""
        if self._outbox is None or resource.value is not None or resource.status == DOES_NOT_EXIST:
            return
        if resource.timer is not None:
            resource.timer.cancel()
        resource.timer = TIMERS.schedule(self._timeout, lambda: self._timed_out(kind, name, resource), shared=True)

    def _timed_out(self, kind: ResourceType, name: str, resource: Resource) -> None:
        with self._lock:
            subscription = self._types.get(kind.url)
            if subscription is None or subscription.resources.get(name) is not resource or resource.timer is None:
                return
            resource.timer = None
            if resource.value is not None:
                return
            resource.status, resource.updated = DOES_NOT_EXIST, time.time()
            tell = [_bound(w.on_does_not_exist, name) for w in resource.watchers]
        _run(tell)

    def _on_response(self, response: Any) -> None:
        tell: List[Callable[[], None]] = []
        with self._lock:
            self._responded, self._failure = True, None
            subscription = self._types.get(response.type_url)
            kind = TYPES.get(response.type_url)
            if subscription is None or kind is None:  # not asked for: nothing to answer
                return
            subscription.nonce = response.nonce
            errors = self._apply(subscription, response, tell)
            if not errors:
                subscription.version = response.version_info
            self._subscribe(subscription, "; ".join(errors) if errors else None)
        _run(tell)

    def _apply(self, subscription: _Type, response: Any, tell: List[Callable[[], None]]) -> List[str]:
        """(Under the lock.) The response's resources into the cache; the errors that NACK it."""
        kind, errors, seen = subscription.kind, [], set()
        now = time.time()
        for i, packed in enumerate(response.resources):
            if packed.type_url == _RESOURCE_WRAPPER:
                from envoy.service.discovery.v3 import discovery_pb2

                packed = discovery_pb2.Resource.FromString(packed.value).resource
            if packed.type_url != kind.url:
                errors.append(f"resource index {i}: type {packed.type_url} is not the response's {kind.url}")
                continue
            try:
                name, value = kind.decode(packed.value, self._context)
            except ResourceError as rejected:
                where = f"resource {rejected.name!r}" if rejected.name else f"resource index {i}"
                errors.append(f"{where}: {rejected}")
                if rejected.name is not None:
                    seen.add(rejected.name)
                    held = subscription.resources.get(rejected.name)
                    if held is not None:  # A46: it keeps its last good value
                        held.status, held.error, held.updated = NACKED, str(rejected), now
                        tell.extend(_bound(w.on_error, rejected.name, str(rejected)) for w in held.watchers)
                continue
            except Exception as failure:  # noqa: BLE001 (not protobuf: whatever the decoder raised)
                errors.append(f"resource index {i}: cannot be decoded: {failure}")
                continue
            if name in seen:
                errors.append(f"resource {name!r}: given twice")
                continue
            seen.add(name)
            held = subscription.resources.get(name)
            if held is None:
                continue  # not subscribed (any more)
            if held.timer is not None:
                held.timer.cancel()
                held.timer = None
            held.status, held.error, held.updated = ACKED, "", now
            if held.raw != packed.value or held.value is None:
                held.value, held.raw, held.version = value, packed.value, response.version_info
                tell.extend(_bound(w.on_resource, name, value) for w in held.watchers)
        if kind.every_name_in_response:
            for name, held in subscription.resources.items():
                if name in seen or held.value is None or self.server.ignore_resource_deletion:
                    continue
                held.status, held.value, held.raw, held.version, held.updated = DOES_NOT_EXIST, None, b"", "", now
                tell.extend(_bound(w.on_does_not_exist, name) for w in held.watchers)
        return errors


def _parts(kind: ResourceType, value: Any, reporter: Optional[LoadReporter]) -> Dict[str, str]:
    """What xds-status shows of a Cluster's value, or of a RouteConfiguration's (none held: nothing)."""
    if value is not None and kind is ROUTE_CONFIGURATION:
        return {"hash_policies": "; ".join(
            f"{host.domains[0] if host.domains else ''} route {k}: {hash_policy.describe(route.request_hash)}"
            for host in value.virtual_hosts for k, route in enumerate(host.routes) if route.request_hash)}
    if value is None or kind is not CLUSTER:
        return {}
    policy = in_force(value.lb_policy)
    if policy == RING_HASH:
        low, high = value.ring_sizes
        policy += f" (ring of {min(low, RING_SIZE_CAP)} to {min(high, RING_SIZE_CAP)} entries)"
    reports = ""
    if value.load_reports:
        stream = "stream open" if reporter is not None and reporter.streaming else "no stream yet"
        reports = f"reporting to the management server ({stream}, {reporter.reports if reporter else 0} sent)"
    return {"tls": describe(value.tls), "lb_policy": value.lb_policy, "lb_policy_in_force": policy,
            "retry_budget": "" if value.retry_budget is None else value.retry_budget.describe(),
            "load_reports": reports}


def _requests(outbox: queue.Queue[Any], writers: List[threading.Thread]) -> Iterator[Any]:
    writers[:] = [t for t in writers if t.is_alive()] + [threading.current_thread()]
    while True:
        request = outbox.get()
        if request is _END:
            return
        yield request


def _serialized(request: Any) -> bytes:
    return request.SerializeToString()  # type: ignore[no-any-return]


def _response(data: bytes) -> Any:
    from envoy.service.discovery.v3 import discovery_pb2

    return discovery_pb2.DiscoveryResponse.FromString(data)


def _bound(function: Callable[..., None], *args: Any) -> Callable[[], None]:
    return lambda: function(*args)


def _run(tell: List[Callable[[], None]]) -> None:
    for notify in tell:
        try:
            notify()
        except Exception:  # a watcher's failure is its own
            log.exception("grpc_retry: an xDS watcher failed")


def _channel_to(server: XdsServer) -> grpc.Channel:
    return internals.new_sync_channel(server.server_uri, _CHANNEL_OPTIONS, _credentials(server), None)


def _credentials(server: XdsServer) -> Optional[grpc.ChannelCredentials]:
    """The channel credentials of the bootstrap's `channel_creds` (insecure, or tls with its files); ValueError
    for a type grpc_retry's client cannot make, or a file it cannot read."""
    if server.channel_creds == "insecure":
        return None
    if server.channel_creds != "tls":
        raise ValueError(f"xDS server {server.server_uri}: channel_creds {server.channel_creds!r} is not supported "
                         "by grpc_retry's xDS client (it knows insecure and tls)")
    files: Dict[str, Optional[bytes]] = {}
    for key in ("ca_certificate_file", "private_key_file", "certificate_file"):
        path = server.channel_creds_config.get(key)
        try:
            if path is None:
                files[key] = None
            else:
                with open(path, "rb") as f:
                    files[key] = f.read()
        except OSError as error:
            raise ValueError(f"xDS server {server.server_uri}: channel_creds tls {key}: {error}") from None
    # (No ca_certificate_file: the system's roots, as gRPC's tls credentials use. refresh_interval is not
    # followed: the files are read once, as the channel to the server is made.)
    return grpc.ssl_channel_credentials(files["ca_certificate_file"], files["private_key_file"],
                                        files["certificate_file"])


def _node_message(node: Node) -> Any:
    from envoy.config.core.v3 import base_pb2
    from google.protobuf import struct_pb2

    from grpc_retry._version import __version__

    message = base_pb2.Node(id=node.id, cluster=node.cluster, user_agent_name="grpc_retry",
                            user_agent_version=__version__,
                            client_features=["envoy.lb.does_not_support_overprovisioning",
                                             "xds.config.resource-in-sotw"])
    message.locality.region, message.locality.zone = node.locality.region, node.locality.zone
    message.locality.sub_zone = node.locality.sub_zone
    if node.metadata:
        metadata = struct_pb2.Struct()
        metadata.update(dict(node.metadata))
        message.metadata.CopyFrom(metadata)
    return message
