"""The `xds` extra (xds-protos) carries its own copies of googleapis' google/rpc and google/api modules and an
`opentelemetry/__init__.py`: in a process that has it, grpcio-status, google-api-core and OpenTelemetry must still
work (tox runs this on the oldest and the newest grpcio)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("envoy")

_SCRIPT = """
import grpc
from envoy.service.discovery.v3 import discovery_pb2  # the extra, first
from envoy.config.listener.v3 import listener_pb2
from google.api_core import exceptions
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import grpc_retry._backends.xds.client

detail = error_details_pb2.RetryInfo()
detail.retry_delay.FromMilliseconds(300)
status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message="busy")
status.details.add().Pack(detail)


class Call:
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "busy"

    def trailing_metadata(self):
        return (("grpc-status-details-bin", status.SerializeToString()),)


assert rpc_status.from_call(Call()) == status
assert isinstance(exceptions.from_grpc_status(grpc.StatusCode.UNAVAILABLE, "busy"), exceptions.ServiceUnavailable)
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
with provider.get_tracer("t").start_as_current_span("s"):
    assert trace.get_current_span().get_span_context().is_valid
assert [span.name for span in exporter.get_finished_spans()] == ["s"]
assert discovery_pb2.DiscoveryRequest(type_url="x").type_url == "x" and listener_pb2.Listener(name="l").name == "l"
print("ok")
"""


def test_grpcio_status_api_core_and_opentelemetry_work_beside_the_extra(tmp_path: Path) -> None:
    # (Run away from the source tree, which would shadow the installed, compiled package.)
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
