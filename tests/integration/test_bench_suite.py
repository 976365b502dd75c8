"""`python -m bench --quick`: every benchmark runs against the installed package and prints its figures."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # timed scenarios with servers: run on 3.11 only (tox.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_suite_runs_every_benchmark():
    done = subprocess.run([sys.executable, "-m", "bench", "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [line["benchmark"] for line in lines[:-1]] == ["overhead", "backends", "hedging", "headers_shape", "budget"]
    backends = lines[1]
    assert backends["grpc_retry_aio"] == 1.0 and backends["grpc_retry_sync"] == 1.0


def test_a_setting_is_compared_in_one_process():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "knob.py"), "grpc_retry._timer:LANE_REACH=16,32",
                           "--calls", "64", "--rounds", "2", "--inflight", "1,4"], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for inflight in ("1", "4"):
        assert set(result[inflight]) == {"16", "32", "plain_us"}
        assert all(result[inflight][setting]["ratio"] > 0 for setting in ("16", "32"))
