"""`python -m grpc_retry demo`, with short settings: the table is printed, its figures are sane, the chart is a
PNG; usage errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpc_retry", "demo", "--calls", "300", *args],
                          capture_output=True, text=True, timeout=240, cwd="/")


def test_the_demo_prints_its_table_and_draws_its_chart(tmp_path):
    chart = tmp_path / "cdf.png"
    done = demo("--plot", str(chart))
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("grpcio, retry policy", "grpc_retry, no policy", "grpc_retry, retry policy", "grpc_retry, hedging"):
        assert name in done.stdout
    assert "cut the p99 from" in done.stdout and "channel constructor" in done.stdout
    data = chart.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_the_figures_are_sane():
    done = demo("--json")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    grpcio, retry, hedging = rows["grpcio, retry policy"], rows["grpc_retry, retry policy"], \
        rows["grpc_retry, hedging policy"]
    assert retry["success"] >= grpcio["success"] and retry["success"] >= 0.99
    assert retry["retries_to_a_new_backend"] == 1.0
    assert hedging["p99_ms"] < grpcio["p99_ms"] / 2
    assert rows["grpc_retry, no policy"]["attempts_per_call"] == 1.0
    outliers = rows["grpc_retry, retry + outlier detection"]
    assert outliers["success"] >= 0.99 and outliers["attempts_per_call"] < retry["attempts_per_call"]


def test_the_sync_demo_and_usage_errors():
    done = demo("--sync", "--json")
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])
    assert demo("--fail-share", "2").returncode == 2
