"""While grpcio's observability plugin is registered (grpcio-observability, grpcio-csm-observability), grpc_retry's
sync attempts go through grpcio's own Python call layer, which records each of them: the direct attempt shapes
(blocking unary, response streams) step aside. Side by side with grpcio's channel, with a plugin that counts what
grpcio records."""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent import futures
from typing import Any, Iterator, List, Tuple

import grpc
import pytest
from grpc import _observability

import grpc_retry

SERVICE = "grpc_retry.test.Observed"
CONFIG = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]})


class _Counting(_observability.ObservabilityPlugin):  # type: ignore[type-arg]
    """Stats on, from grpcio's Python layer only: no C-core call tracer (it would need a C++ one)."""

    def __init__(self) -> None:
        self.recorded: List[Tuple[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def stats_enabled(self) -> bool:
        return True

    @property
    def observability_enabled(self) -> bool:
        return False

    def create_client_call_tracer(self, method_name: bytes, target: bytes) -> Any:
        raise AssertionError("no call tracer with observability_enabled False")

    def save_trace_context(self, trace_id: str, span_id: str, is_sampled: bool) -> None:
        pass

    def create_server_call_tracer_factory(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def record_rpc_latency(self, method: str, target: str, rpc_latency: float, status_code: Any) -> None:
        with self._lock:
            self.recorded.append((method, status_code))


@pytest.fixture
def server() -> Iterator[str]:
    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        retried = any(key == "grpc-previous-rpc-attempts" for key, _ in context.invocation_metadata())
        if request == b"flaky" and not retried:  # a flaky call's first attempt fails, before any message
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        for i in range(3):
            yield request + bytes([i])

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()  # before the plugin: the server would ask it for a C-core tracer factory
    yield f"127.0.0.1:{port}"
    server.stop(None)


def _run(channel: grpc.Channel) -> List[Any]:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    return [unary(b"a", timeout=10), unary.with_call(b"b", timeout=10)[0], list(stream(b"c", timeout=10)),
            list(stream(b"flaky", timeout=10))]


def test_attempts_go_through_grpcios_layer_while_a_plugin_is_registered(server: str) -> None:
    plugin = _Counting()
    _observability.observability_init(plugin)
    try:
        with grpc.insecure_channel(server, options=[("grpc.service_config", CONFIG)]) as channel:
            expected = _run(channel)
        by_grpcio = list(plugin.recorded)
        del plugin.recorded[:]
        with grpc_retry.insecure_channel(server, [("grpc.service_config", CONFIG)]) as channel:
            got = _run(channel)
        by_ours = list(plugin.recorded)
    finally:
        _observability.observability_deinit()
    assert got == expected == [b"a", b"b", [b"c\x00", b"c\x01", b"c\x02"], [b"flaky\x00", b"flaky\x01", b"flaky\x02"]]
    methods = [f"/{SERVICE}/Unary"] * 2 + [f"/{SERVICE}/Stream"] * 2
    assert [method for method, _ in by_grpcio] == methods
    # grpc_retry's attempts are grpcio's calls, each recorded: the flaky stream's two attempts, the first failed.
    ok, unavailable = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE
    assert Counter(by_ours) == Counter([(methods[0], ok), (methods[1], ok), (methods[2], ok),
                                        (methods[3], unavailable), (methods[3], ok)])

