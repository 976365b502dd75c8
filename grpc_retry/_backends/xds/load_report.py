"""Load reports (LRS) for the clusters whose `lrs_server` is the management server itself, as gRPC's clients send
them: one LoadReportingService stream per server, opened while a cluster reports to it, on the ADS client's
channel. The server says which clusters it wants (or all) and how often; each report gives, per cluster and
locality, the attempts issued, in progress, succeeded and failed since the last (each attempt is a pick, as gRPC
counts them), and the calls its drops refused, by category.

A cluster's counts come from its subchannels' picker (per slot: load_started / load_ended) and its drops; its
`Source` maps slots to localities."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import grpc

log = logging.getLogger("grpc_retry")

LRS_METHOD = "/envoy.service.load_stats.v3.LoadReportingService/StreamLoadStats"
SEND_ALL_CLUSTERS = "envoy.lrs.supports_send_all_clusters"
RETRY_S = 1.0  # after a stream that ended, the next one
_END = object()

LocalityName = Tuple[str, str, str]  # region, zone, sub_zone


class Source:
    """One cluster's loads: its picker's per-slot counts, by locality (`locality_of(slot)`: None for a slot that
    holds no endpoint of the cluster now), and its drops."""

    def __init__(self, cluster: str, service: str, picker: Any, locality_of: Callable[[int], Optional[LocalityName]],
                 drops: Any) -> None:
        self.cluster, self.service = cluster, service
        self._picker, self._locality_of, self._drops = picker, locality_of, drops

    def take(self, localities: Dict[LocalityName, List[int]]) -> Tuple[Dict[str, int], int]:
        """Add the loads since the last time to `localities` (issued, in progress, succeeded, failed); the drops
        since then, by category and without one."""
        for slot, counts in enumerate(self._picker.take_loads()):
            where = self._locality_of(slot)
            if where is None or not any(counts):
                continue
            total = localities.setdefault(where, [0, 0, 0, 0])
            for i, count in enumerate(counts):
                total[i] += count
        return self._drops.take_dropped()  # type: ignore[no-any-return]


class LoadReporter:
    """The LRS stream of one management server (its ADS client's channel, node and thread's lifetime)."""

    def __init__(self, channel: grpc.Channel, node: Any) -> None:
        self._channel, self._node = channel, node
        self._lock = threading.Lock()
        self._sources: Dict[Tuple[str, str], List[Source]] = {}
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._call: Any = None
        self._closed = False
        self.reports = 0  # sent (xds-status)

    @property
    def streaming(self) -> bool:
        return self._call is not None

    def add(self, source: Source) -> None:
        with self._lock:
            self._sources.setdefault((source.cluster, source.service), []).append(source)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="grpc_retry-lrs", daemon=True)
                self._thread.start()

    def remove(self, source: Source) -> None:
        with self._lock:
            sources = self._sources.get((source.cluster, source.service), [])
            if source in sources:
                sources.remove(source)
            if not sources:
                self._sources.pop((source.cluster, source.service), None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
            self._stream()
            self._wake.wait(RETRY_S)

    def _stream(self) -> None:
        from envoy.service.load_stats.v3 import lrs_pb2

        from grpc_retry._backends.xds.client import _node_message

        outbox: queue.Queue[Any] = queue.Queue()
        node = _node_message(self._node)
        node.client_features.append(SEND_ALL_CLUSTERS)
        outbox.put(lrs_pb2.LoadStatsRequest(node=node))
        stream: Any = self._channel.stream_stream(LRS_METHOD, request_serializer=lambda m: m.SerializeToString(),
                                             response_deserializer=lrs_pb2.LoadStatsResponse.FromString)
        reporting: Optional[threading.Thread] = None
        wanted: List[Any] = [None]  # the last response: which clusters, how often
        try:
            call = stream(_requests(outbox), wait_for_ready=True)
            with self._lock:
                self._call = call
                if self._closed:
                    call.cancel()
            for response in call:
                wanted[0] = response
                if reporting is None:
                    reporting = threading.Thread(target=self._report, args=(outbox, wanted, call),
                                                 name="grpc_retry-lrs-report", daemon=True)
                    reporting.start()
        except grpc.RpcError:
            pass
        finally:
            with self._lock:
                self._call = None
            outbox.put(_END)
            if reporting is not None:
                reporting.join(5)

    def _report(self, outbox: queue.Queue[Any], wanted: List[Any], call: Any) -> None:
        """Send a report at each interval the server asks for, while the stream lasts."""
        from envoy.config.endpoint.v3 import load_report_pb2
        from envoy.service.load_stats.v3 import lrs_pb2
        from google.protobuf import duration_pb2

        last = time.monotonic()
        while call.is_active():
            response = wanted[0]
            interval = max(response.load_reporting_interval.ToTimedelta().total_seconds(), 0.1)
            if self._wake.wait(max(0.0, last + interval - time.monotonic())) or not call.is_active():
                return
            now = time.monotonic()
            elapsed = duration_pb2.Duration()
            elapsed.FromNanoseconds(int((now - last) * 1e9))
            last = now
            with self._lock:
                sources = {key: list(found) for key, found in self._sources.items()
                           if response.send_all_clusters or key[0] in response.clusters}
            stats = []
            for (cluster, service), found in sources.items():
                stat = load_report_pb2.ClusterStats(cluster_name=cluster, cluster_service_name=service,
                                                    load_report_interval=elapsed)
                localities: Dict[LocalityName, List[int]] = {}
                for source in found:
                    dropped, uncategorized = source.take(localities)
                    for category, count in dropped.items():
                        stat.dropped_requests.add(category=category, dropped_count=count)
                    stat.total_dropped_requests += sum(dropped.values()) + uncategorized
                for (region, zone, sub_zone), (issued, in_progress, ok, failed) in sorted(localities.items()):
                    locality = stat.upstream_locality_stats.add(
                        total_issued_requests=issued, total_requests_in_progress=in_progress,
                        total_successful_requests=ok, total_error_requests=failed)
                    locality.locality.region, locality.locality.zone = region, zone
                    locality.locality.sub_zone = sub_zone
                stats.append(stat)
            outbox.put(lrs_pb2.LoadStatsRequest(cluster_stats=stats))
            self.reports += 1


def _requests(outbox: queue.Queue[Any]) -> Iterator[Any]:
    while True:
        item = outbox.get()
        if item is _END:
            return
        yield item
