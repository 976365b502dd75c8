"""`python -m grpc_retry check-config`: exit status 0 valid / 1 invalid / 2 usage, every error and warning with
its path, and what the config does per method."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from grpc_retry.__main__ import main

CONFIG = {"methodConfig": [
    {"name": [{"service": "pkg.Svc"}], "retryPolicy": {"maxAttempts": 9, "initialBackoff": "0.1s",
                                                        "maxBackoff": "0.3s", "backoffMultiplier": 2,
                                                        "retryableStatusCodes": ["UNAVAILABLE"]}},
    {"name": [{"service": "pkg.Svc", "method": "Fast"}], "hedgingPolicy": {
        "maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": [14]}, "timeout": "2s"}],
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}


def run(tmp_path, capsys, doc, *flags):
    path = tmp_path / "config.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    code = main(["check-config", *flags, str(path)])
    return code, capsys.readouterr()


def test_a_valid_config_and_what_it_does(tmp_path, capsys):
    code, out = run(tmp_path, capsys, CONFIG)
    assert code == 0
    lines = out.out.splitlines()
    assert lines[0] == "valid"
    assert "/pkg.Svc/*: retry, 5 attempts, on UNAVAILABLE; backoff retry 1: 0-0.1s, retry 2: 0-0.2s, " \
           "retry 3: 0-0.3s, retry 4: 0-0.3s" in lines[1]
    assert lines[2] == "  /pkg.Svc/Fast: hedging, 3 attempts, hedges at 0.05s, 0.1s; non-fatal: UNAVAILABLE; " \
                       "timeout 2.0"
    assert "stop at or below 5.0 of 10.0 tokens (about 5 failures in a row)" in out.out
    assert lines[1].endswith("; no per-attempt timeout")


def test_each_methods_per_attempt_timeout_is_printed(tmp_path, capsys):
    doc = json.loads(json.dumps(CONFIG))
    policy = doc["methodConfig"][0]["retryPolicy"]
    policy["perAttemptRecvTimeout"] = "0.25s"
    policy["retryableStatusCodes"] = []
    code, out = run(tmp_path, capsys, doc)
    assert code == 0
    line = out.out.splitlines()[1]
    assert ": retry, 5 attempts, on no status;" in line
    assert line.endswith("; each attempt must answer within 0.25s (perAttemptRecvTimeout), else it is retried")
    code, out = run(tmp_path, capsys, doc, "--json")
    assert json.loads(out.out)["methods"]["/pkg.Svc/*"]["per_attempt_recv_timeout_s"] == 0.25


def test_the_client_cap_is_an_option(tmp_path, capsys):
    code, out = run(tmp_path, capsys, CONFIG, "--json", "--max-attempts", "3")
    report = json.loads(out.out)
    assert code == 0 and report["methods"]["/pkg.Svc/*"]["max_attempts"] == 3


def test_the_retry_budget_option_is_checked_and_the_budget_in_force_printed(tmp_path, capsys):
    code, out = run(tmp_path, capsys, CONFIG, "--retry-budget", '{"budgetPercent": 25}')
    assert code == 0
    assert "  retry budget (concurrency form): retries in flight at most 25% of the calls in flight, and at least 3" \
        in out.out.splitlines()
    code, out = run(tmp_path, capsys, CONFIG, "--json", "--retry-budget", "{}")
    assert json.loads(out.out)["retry_budget"]["in_force"] == \
        "retries at most 20% of the calls over 10s, and at least 10 per 1s"
    code, out = run(tmp_path, capsys, CONFIG, "--retry-budget", '{"minRetryRate": {"interval": "7200s"}}')
    assert code == 1
    assert "error: channel option grpc_retry.retry_budget: minRetryRate.interval: must be from 1s to 1h" in out.out


def test_an_invalid_config_lists_every_error(tmp_path, capsys):
    code, out = run(tmp_path, capsys, {"methodConfig": [{"name": [{}], "timeout": "soon",
                                                         "retryPolicy": {"maxAttempts": 1}}]})
    assert code == 1
    assert "error: methodConfig[0].timeout: invalid duration 'soon'" in out.out
    assert "error: methodConfig[0].retryPolicy.maxAttempts: must be at least 2" in out.out
    assert out.out.splitlines()[-1].startswith("invalid: ")


def test_warnings_with_paths_and_json(tmp_path, capsys):
    doc = {"methodConfig": [{"name": [{"service": "/pkg.Svc"}], "hedgingPolicy": {"maxAttempts": 2,
                                                                                  "hedgeDelay": "1s"}}]}
    code, out = run(tmp_path, capsys, doc, "--json")
    report = json.loads(out.out)
    assert code == 0 and report["valid"]
    assert any("hedgeDelay: unknown key, ignored (did you mean 'hedgingDelay'?)" in w for w in report["warnings"])
    assert any("name[0].service" in w and "can never match" in w for w in report["warnings"])
    assert report["methods"]["//pkg.Svc/*"]["hedges_sent_at_s"] == [0.0]  # the misspelt delay: all at once


@pytest.mark.parametrize("argv", [["check-config"], ["check-config", "/no/such/file"], [],
                                  ["check-config", "--max-attempts", "0", "x"]])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2


def test_standard_input_and_the_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "grpc_retry", "check-config", "-"], input='{"a": 1, "a": 2}',
                          capture_output=True, text=True, cwd="/")
    assert done.returncode == 1 and "<root>: duplicate key 'a'" in done.stdout


def test_output_to_a_stream():
    from grpc_retry._check_config import main as check

    out = io.StringIO()
    assert check("/dev/null", False, 5, out) == 0 and out.getvalue().startswith("valid")


def test_outlier_detection_and_health_checks_are_shown(tmp_path, capsys):
    doc = {"loadBalancingConfig": [{"outlier_detection_experimental": {
        "interval": "1s", "baseEjectionTime": "5s", "maxEjectionPercent": 50,
        "failurePercentageEjection": {"threshold": 60, "requestVolume": 10, "minimumHosts": 3},
        "childPolicy": [{"round_robin": {}}]}}], "healthCheckConfig": {"serviceName": "pkg.Svc"}}
    code, out = run(tmp_path, capsys, doc)
    assert code == 0
    assert "  load balancing: round_robin" in out.out
    assert "  outlier detection: every 1.0s, eject on over 60% failed (hosts with 10+ calls, 3+ hosts, enforced " \
           "100%); for 5.0s x ejections in a row, at most 300.0s; at most 50% of backends out" in out.out
    assert "  health checks: Health/Watch for service 'pkg.Svc'" in out.out
    code, out = run(tmp_path, capsys, doc, "--json")
    report = json.loads(out.out)
    assert report["outlier_detection"]["failure_percentage_ejection"]["threshold"] == 60
    assert report["health_check_service"] == "pkg.Svc"


def test_strict_fails_on_warnings_alone(tmp_path, capsys):
    doc = {"methodConfig": [{"name": [{"service": "pkg.Svc"}], "hedgingPolicy": {"maxAttempts": 2,
                                                                                 "hedgeDelay": "1s"}}]}
    code, out = run(tmp_path, capsys, doc)
    assert code == 0 and out.out.startswith("warning: ")
    code, out = run(tmp_path, capsys, doc, "--strict")
    assert code == 1
    assert out.out.splitlines()[1] == "valid, 1 warning(s)"  # the report is the same; only the verdict differs
    assert out.out.splitlines()[-1] == "failed: --strict and 1 warning(s)"
    code, out = run(tmp_path, capsys, doc, "--strict", "--json")
    assert code == 1 and json.loads(out.out)["valid"]


def test_strict_passes_a_clean_config_and_fails_an_invalid_one(tmp_path, capsys):
    code, out = run(tmp_path, capsys, CONFIG, "--strict")
    assert code == 0 and "failed" not in out.out
    code, out = run(tmp_path, capsys, {"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1}}]},
                    "--strict")
    assert code == 1 and out.out.splitlines()[-1].startswith("invalid: ")


def test_strict_from_the_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "grpc_retry", "check-config", "--strict", "-"],
                          input='{"loadBalancingPolcy": "round_robin"}', capture_output=True, text=True, cwd="/")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "loadBalancingPolcy: unknown key, ignored (did you mean 'loadBalancingPolicy'?)" in done.stdout
