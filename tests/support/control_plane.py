"""A real xDS control plane for tests: an ADS server (state of the world, v3, on the envoy protos of `xds-protos`)
that serves the resources a test sets, pushes every change to the streams subscribed to it, and records each
request (ACK or NACK, version, nonce, error) by the client's node id. grpcio's own xDS client and grpc_retry's
both talk to it, so one can be the other's oracle."""

from __future__ import annotations

import itertools
import json
import queue
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.load_stats.v3 import lrs_pb2, lrs_pb2_grpc
from google.protobuf import any_pb2, duration_pb2

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINTS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
_EVERY_NAME_REQUIRED = (LISTENER, CLUSTER)  # a response of these types holds every subscribed resource
_END = object()


@dataclass(frozen=True)
class Request:
    node: str
    type_url: str
    version: str
    nonce: str
    names: Tuple[str, ...]
    error: str  # the NACK's error_detail message ("" for an ACK or a subscription)
    answered: Optional[int]  # the version of the response it answers (None: no response's)

    @property
    def nack(self) -> bool:
        return bool(self.error)


class ControlPlane:
    """`tls`: (private key, certificate) PEM bytes to serve TLS with, as a secure management server does."""

    def __init__(self, tls: Optional[Tuple[bytes, bytes]] = None) -> None:
        self._lock = threading.Condition()
        self._resources: Dict[str, Dict[str, any_pb2.Any]] = {}
        self._versions: Dict[str, int] = {}
        self._streams: List[_Stream] = []
        self._nonces = itertools.count(1)
        self._sent: Dict[str, int] = {}  # nonce -> version of the response that carried it
        self.requests: List[Request] = []
        self.load_reports: List[Tuple[str, Any]] = []  # (node, ClusterStats) of every LRS report
        self.lrs_streams = 0
        self.report_interval = 0.2  # seconds: what the LRS server asks its clients for
        self._tls = tls
        self.port = 0
        self.start()

    def start(self) -> None:
        """Serve (again, after stop(): on the same port, with the same resources)."""
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), self._server)
        lrs_pb2_grpc.add_LoadReportingServiceServicer_to_server(_LoadReports(self), self._server)
        address = f"127.0.0.1:{self.port}"
        if self._tls is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, grpc.ssl_server_credentials([self._tls]))
        self._server.start()

    def stop(self) -> None:
        """Stop serving, as a management server that goes down: every stream ends, no connection is taken."""
        self.drop_streams()
        self._server.stop(None).wait()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap(self, node: str, features: Tuple[str, ...] = (), creds: Optional[Dict[str, Any]] = None,
                  **extra: Any) -> str:
        """A bootstrap naming this server (`creds`: its channel_creds entry; insecure by default)."""
        server = {"server_uri": self.target if creds is None else f"localhost:{self.port}",
                  "channel_creds": [creds or {"type": "insecure"}], "server_features": list(features)}
        return json.dumps({"xds_servers": [server], "node": {"id": node}, **extra})

    def set(self, message: Any, name: Optional[str] = None) -> int:
        """Serve `message` (a Listener, RouteConfiguration, Cluster or ClusterLoadAssignment) under its name; the
        type's new version."""
        packed = any_pb2.Any()
        packed.Pack(message)
        resource_name = name or getattr(message, "name", "") or message.cluster_name
        with self._lock:
            self._resources.setdefault(packed.type_url, {})[resource_name] = packed
            return self._changed(packed.type_url)

    def remove(self, type_url: str, name: str) -> int:
        with self._lock:
            self._resources.get(type_url, {}).pop(name, None)
            return self._changed(type_url)

    def _changed(self, type_url: str) -> int:
        version = self._versions[type_url] = self._versions.get(type_url, 0) + 1
        for stream in self._streams:
            if type_url in stream.subscribed:
                stream.send(self._response(stream, type_url))
        self._lock.notify_all()
        return version

    def _response(self, stream: _Stream, type_url: str) -> discovery_pb2.DiscoveryResponse:
        names = stream.subscribed[type_url]
        held = self._resources.get(type_url, {})
        chosen = [resource for name, resource in sorted(held.items()) if not names or name in names]
        nonce = str(next(self._nonces))
        version = self._sent[nonce] = self._versions.get(type_url, 0)
        return discovery_pb2.DiscoveryResponse(version_info=str(version), resources=chosen, type_url=type_url,
                                               nonce=nonce)

    def _request(self, stream: _Stream, request: discovery_pb2.DiscoveryRequest) -> None:
        with self._lock:
            if request.node.id:
                stream.node = request.node.id
            names = set(request.resource_names)
            record = Request(stream.node, request.type_url, request.version_info, request.response_nonce,
                             tuple(sorted(names)), request.error_detail.message,
                             self._sent.get(request.response_nonce))
            self.requests.append(record)
            new = request.type_url not in stream.subscribed or stream.subscribed[request.type_url] != names
            stream.subscribed[request.type_url] = names
            if new:
                stream.send(self._response(stream, request.type_url))
            self._lock.notify_all()

    def answers(self, node: str, type_url: str) -> List[Request]:
        """The ACKs and NACKs of `node` for `type_url`, in order."""
        with self._lock:
            return [r for r in self.requests if r.node == node and r.type_url == type_url and r.nonce]

    def wait_for(self, predicate: Any, timeout: float = 10.0, what: str = "the control plane") -> None:
        with self._lock:
            if not self._lock.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def wait_answer(self, node: str, type_url: str, version: int, timeout: float = 10.0) -> Request:
        """`node`'s ACK or NACK of the response of `type_url` at `version`."""
        def answered() -> bool:
            return any(r.answered == version for r in self.answers(node, type_url))
        self.wait_for(answered, timeout, f"{node}'s answer to {type_url} version {version}")
        return next(r for r in self.answers(node, type_url) if r.answered == version)

    def load_totals(self, node: str, cluster: str) -> Dict[str, int]:
        """What `node`'s load reports for `cluster` add up to: issued, succeeded, failed (over every locality), the
        last report's in progress, and drops."""
        with self._lock:
            found = [stats for who, stats in self.load_reports if who == node and stats.cluster_name == cluster]
        totals = {"issued": 0, "succeeded": 0, "failed": 0, "in_progress": 0, "dropped": 0}
        for stats in found:
            for locality in stats.upstream_locality_stats:
                totals["issued"] += locality.total_issued_requests
                totals["succeeded"] += locality.total_successful_requests
                totals["failed"] += locality.total_error_requests
            totals["dropped"] += stats.total_dropped_requests
        if found:
            totals["in_progress"] = sum(loc.total_requests_in_progress for loc in found[-1].upstream_locality_stats)
        return totals

    def streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def drop_streams(self) -> None:
        """End every stream (as a management server that restarts)."""
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.send(_END)

    def close(self) -> None:
        self.stop()


class _Stream:
    def __init__(self) -> None:
        self.node = ""
        self.subscribed: Dict[str, Set[str]] = {}
        self._out: queue.Queue[Any] = queue.Queue()

    def send(self, response: Any) -> None:
        self._out.put(response)

    def responses(self, context: grpc.ServicerContext) -> Iterator[discovery_pb2.DiscoveryResponse]:
        while context.is_active():
            try:
                item = self._out.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END:
                return
            yield item


class _LoadReports(lrs_pb2_grpc.LoadReportingServiceServicer):
    """LRS: asks every client for all its clusters at the plane's interval, and keeps what each report says."""

    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane

    def StreamLoadStats(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        node = ""
        with self._plane._lock:
            self._plane.lrs_streams += 1
        for request in request_iterator:
            if request.node.id:
                node = request.node.id
                interval = duration_pb2.Duration()
                interval.FromMilliseconds(int(self._plane.report_interval * 1000))
                yield lrs_pb2.LoadStatsResponse(send_all_clusters=True, load_reporting_interval=interval)
            with self._plane._lock:
                self._plane.load_reports.extend((node, stats) for stats in request.cluster_stats)
                self._plane._lock.notify_all()


class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane

    def StreamAggregatedResources(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        stream = _Stream()
        with self._plane._lock:
            self._plane._streams.append(stream)
        context.add_callback(lambda: self._gone(stream))

        def read() -> None:
            try:
                for request in request_iterator:
                    self._plane._request(stream, request)
            except grpc.RpcError:
                pass
            stream.send(_END)
        threading.Thread(target=read, daemon=True).start()
        yield from stream.responses(context)

    def _gone(self, stream: _Stream) -> None:
        with self._plane._lock:
            if stream in self._plane._streams:
                self._plane._streams.remove(stream)
