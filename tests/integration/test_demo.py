"""`python -m grpc_retry demo`, with short settings: piped, it prints its table whole and its sentences wrapped;
its figures are sane, its latencies are those of the calls that succeeded; the chart shows the tail on log axes;
`--help` describes what it prints; usage errors exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from grpc_retry import _demo

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)

CHANNELS = (_demo.GRPCIO, _demo.NO_POLICY, _demo.RETRY, _demo.OUTLIERS, _demo.BUDGET, _demo.HEDGING)
KEYS = {"calls", "failed", "success", "p50_ms", "p99_ms", "attempts_per_call", "retries_to_a_new_backend"}


def demo(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "40"}  # a narrow terminal's setting must not narrow what goes down a pipe
    return subprocess.run([sys.executable, "-m", "grpc_retry", "demo", "--calls", "300", *args],
                          capture_output=True, text=True, timeout=240, cwd="/", env=env)


def test_piped_the_demo_prints_its_table_whole_and_draws_its_chart(tmp_path):
    chart = tmp_path / "tail.png"
    done = demo("--plot", str(chart))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    rule = next(line for line in lines if line and set(line) == {"-"})
    for name in CHANNELS:  # a row per channel, on one line, every cell whole
        row = next(line for line in lines if line.startswith(name + "  "))
        assert len(re.split(r" {2,}", row)) == len(_demo.HEADERS), row
    table = lines[lines.index(rule) - 2:lines.index(rule) + 1 + len(CHANNELS)]
    assert all(len(line) <= len(rule) for line in table), table
    prose = [line for line in lines if line not in table and not line.startswith("latency tail chart written to")]
    assert all(len(line) <= _demo.PROSE_WIDTH for line in prose), prose  # a path is never wrapped
    text = " ".join(done.stdout.split())
    for said in ("latency of the calls that succeeded", "cut the p99 from", "channel constructor"):
        assert said in text
    data = chart.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_the_figures_are_sane():
    done = demo("--json")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(rows) == list(CHANNELS) and all(set(row) == KEYS for row in rows.values())
    grpcio, retry, hedging = rows[_demo.GRPCIO], rows[_demo.RETRY], rows[_demo.HEDGING]
    assert retry["success"] >= grpcio["success"] and retry["success"] >= 0.99
    assert retry["retries_to_a_new_backend"] == 1.0
    assert hedging["p99_ms"] < grpcio["p99_ms"] / 2
    # The budget's row: retries at most 20% of the calls, plus the 10 a second its floor lets through whatever the
    # share (these 300 calls take well under two seconds). The workload needs ~17%, which a short run may exceed
    # (the default 2,000 calls: within 0.5 points of the retry row).
    budget = rows[_demo.BUDGET]
    assert budget["success"] >= retry["success"] - 0.05
    assert budget["attempts_per_call"] <= 1.2 + 20 / budget["calls"]
    no_policy = rows[_demo.NO_POLICY]
    assert no_policy["attempts_per_call"] == 1.0 and no_policy["failed"] > 0
    assert no_policy["p50_ms"] >= 1.0  # every success waits 1 ms on its backend; the failures answer at once
    for row in rows.values():
        assert row["failed"] == round(row["calls"] * (1 - row["success"]))
    outliers = rows[_demo.OUTLIERS]
    assert outliers["success"] >= 0.99 and outliers["attempts_per_call"] < retry["attempts_per_call"]


def test_latencies_are_those_of_the_calls_that_succeeded():
    figures = _demo.summarize([(0.0002, False)] * 60 + [(0.002, True)] * 40, {})
    assert figures["failed"] == 60 and figures["success"] == 0.4
    assert figures["p50_ms"] == figures["p99_ms"] == 2.0  # not the fast failures' 0.2 ms
    assert _demo.summarize([(0.0002, False)] * 3, {})["p50_ms"] is None


def test_the_chart_shows_the_tail_on_log_axes():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    rows = {name: {"calls": 100, "failed": failed, "p99_ms": 200.0,
                   "latencies_ms": sorted([2.0] * (90 - failed) + [200.0] * 10)}
            for name, failed in zip(CHANNELS, (2, 20, 0, 0, 0, 0), strict=True)}
    chart = _demo.figure(rows)
    axes = chart.axes[0]
    assert axes.get_xscale() == axes.get_yscale() == "log"
    lines = {line.get_label().split(":")[0]: line for line in axes.get_lines()}
    assert set(CHANNELS) <= set(lines)
    assert list(lines[_demo.NO_POLICY].get_ydata())[-2:] == [0.2, 0.2]  # failed calls never answer: level at 20%
    assert min(lines[_demo.RETRY].get_ydata()) == 0.01  # all answered: down to the last call, 0 has no log
    plt.close(chart)


def test_help_describes_what_the_demo_prints():
    done = subprocess.run([sys.executable, "-m", "grpc_retry", "demo", "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "100"})
    text = " ".join(done.stdout.split())
    for gone in ("p99.9", "table per channel", "what it means", "success rate", "CDF", "grpc_retry[demo]"):
        assert gone not in text
    for shown in ("failed calls", "p50 and p99 latency of the calls that succeeded", "attempts per call",
                  "retries that went to a backend the call had not used", "no policy", "the same retry policy",
                  "outlier detection", "hedging policy", "log-log", 'pip install -e ".[demo]"'):
        assert shown in text


def test_the_sync_demo_and_usage_errors():
    done = demo("--sync", "--json")
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])
    assert demo("--fail-share", "2").returncode == 2
    assert demo("--plot", "/nonexistent/tail.png").returncode == 2  # at once, not after the run
