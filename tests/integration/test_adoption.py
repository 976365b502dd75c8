"""Adoption in a real process: the gRPC instrumentations teams load (OpenTelemetry's, Sentry's) set up before or
after `import grpc_retry`, with grpc_retry's constructors or with install(all_channels=True); the same program
with grpcio's channels must see the same results (tests/support/instrumented.py, a process per run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "instrumented.py")


def run(*args: str) -> list:
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120,
                          cwd=tempfile.gettempdir())  # away from the source tree's uncompiled grpc_retry
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("which", ["otel", "sentry"])
def test_instrumentation_loaded_before_or_after(which, when):
    grpcio = run(which, when, "grpc")
    ours = run(which, when, "grpc_retry")
    installed = run(which, when, "installed")
    expected = [["sync", False, "a", ["b"] * 3], ["aio", False, "a", ["b"] * 3]]
    assert grpcio == expected
    assert ours == [[api, True, *rest] for api, _, *rest in expected]
    assert installed == ours  # every channel is ours, made through (or under) the instrumentation's constructor
