"""`python -m grpc_retry check-config FILE`: validate a service config exactly as a channel does, print every
error and warning with its path, then what the config does per method."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any, Dict, Iterable, List, Optional, TextIO

from grpc_retry._budget import parse_retry_budget
from grpc_retry._config import (
    STATUS_CODE_NAMES,
    MethodConfig,
    OutlierDetection,
    ServiceConfig,
    ServiceConfigError,
    parse_service_config,
)
from grpc_retry._options import DEFAULT_MAX_ATTEMPTS

EXIT_VALID, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def describe(config: ServiceConfig) -> Dict[str, Any]:
    """What the config does: per name, the policy and its schedule; the throttle; the load balancing."""
    methods = {}
    for key, mc in config.method_configs.items():
        methods[_name(key)] = _method(mc)
    throttle = config.retry_throttling
    return {
        "methods": methods,
        "retry_throttling": None if throttle is None else {
            "max_tokens": throttle.max_tokens, "token_ratio": throttle.token_ratio,
            # A6: retries and hedges stop while the tokens are at or below half of maxTokens.
            "retries_stop_at_or_below_tokens": throttle.max_tokens / 2,
            "failures_in_a_row_to_stop": math.ceil(throttle.max_tokens / 2)},
        "load_balancing": config.lb_policy or "pick_first",
        "outlier_detection": _outliers(config.outlier_detection),
        "health_check_service": config.health_check_service,
    }


def _outliers(od: Optional[OutlierDetection]) -> Optional[Dict[str, Any]]:
    if od is None:
        return None
    report: Dict[str, Any] = {
        "interval_s": od.interval, "base_ejection_time_s": od.base_ejection_time,
        "max_ejection_time_s": od.max_ejection_time, "max_ejection_percent": od.max_ejection_percent}
    if od.success_rate is not None:
        report["success_rate_ejection"] = dataclasses.asdict(od.success_rate)
    if od.failure_percentage is not None:
        report["failure_percentage_ejection"] = dataclasses.asdict(od.failure_percentage)
    return report


def _name(key: str) -> str:
    return "(default: every method)" if key == "" else (key + "*" if key.endswith("/") else key)


def _method(mc: MethodConfig) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if mc.retry_policy is not None:
        rp = mc.retry_policy
        out["policy"] = "retry"
        out["max_attempts"] = rp.max_attempts  # after the client's cap
        # A6: retry n waits random(0, min(initialBackoff * multiplier^(n-1), maxBackoff)).
        out["backoff_s"] = [[0.0, round(min(rp.initial_backoff * rp.backoff_multiplier ** (n - 1), rp.max_backoff), 6)]
                            for n in range(1, rp.max_attempts)]
        out["retryable_status_codes"] = sorted(_code_names(rp.retryable_status_codes))
        out["per_attempt_recv_timeout_s"] = rp.per_attempt_recv_timeout  # None: attempts are not timed
    elif mc.hedging_policy is not None:
        hp = mc.hedging_policy
        out["policy"] = "hedging"
        out["max_attempts"] = hp.max_attempts
        out["hedges_sent_at_s"] = [round(k * hp.hedging_delay, 6) for k in range(1, hp.max_attempts)]
        out["non_fatal_status_codes"] = sorted(_code_names(hp.non_fatal_status_codes))
    else:
        out["policy"] = "none"
    for field in ("timeout", "wait_for_ready", "max_request_message_bytes", "max_response_message_bytes"):
        value = getattr(mc, field)
        if value is not None:
            out[field] = value
    return out


def _code_names(codes: Iterable[int]) -> List[str]:
    return [STATUS_CODE_NAMES[c] for c in codes]


def check(text: str, max_attempts_cap: int = DEFAULT_MAX_ATTEMPTS, retry_budget: Optional[str] = None
          ) -> Dict[str, Any]:
    """The report on a service config, and on the grpc_retry.retry_budget option's value when one is given."""
    budget: Optional[Dict[str, Any]] = None
    if retry_budget is not None:
        try:
            settings = parse_retry_budget(retry_budget)
        except ValueError as error:
            return {"valid": False, "errors": [str(error)], "warnings": []}
        assert settings is not None
        budget = {**dataclasses.asdict(settings), "in_force": settings.describe()}
    try:
        config = parse_service_config(text, max_attempts_cap=max_attempts_cap)
    except ServiceConfigError as error:
        return {"valid": False, "errors": error.errors, "warnings": []}
    return {"valid": True, "errors": [], "warnings": list(config.warnings), **describe(config),
            "retry_budget": budget}


def _print_human(report: Dict[str, Any], out: TextIO) -> None:
    for error in report["errors"]:
        print(f"error: {error}", file=out)
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=out)
    if not report["valid"]:
        print(f"invalid: {len(report['errors'])} error(s)", file=out)
        return
    print("valid" + (f", {len(report['warnings'])} warning(s)" if report["warnings"] else ""), file=out)
    for name, method in report["methods"].items():
        line = f"  {name}: {method['policy']}"
        if method["policy"] == "retry":
            schedule = ", ".join(f"retry {n}: 0-{hi}s" for n, (_, hi) in enumerate(method["backoff_s"], 1))
            codes = ", ".join(method["retryable_status_codes"]) or "no status"
            line += f", {method['max_attempts']} attempts, on {codes}; backoff {schedule}"
            recv = method["per_attempt_recv_timeout_s"]
            line += "; no per-attempt timeout" if recv is None else \
                f"; each attempt must answer within {recv}s (perAttemptRecvTimeout), else it is retried"
        elif method["policy"] == "hedging":
            sent = ", ".join(f"{t}s" for t in method["hedges_sent_at_s"])
            codes = ", ".join(method["non_fatal_status_codes"]) or "none (every failure is fatal)"
            line += f", {method['max_attempts']} attempts, hedges at {sent}; non-fatal: {codes}"
        for field in ("timeout", "wait_for_ready", "max_request_message_bytes", "max_response_message_bytes"):
            if field in method:
                line += f"; {field} {method[field]}"
        print(line, file=out)
    budget = report.get("retry_budget")
    if budget is not None:
        print(f"  retry budget ({'concurrency' if budget['concurrent'] else 'rate'} form): {budget['in_force']}",
              file=out)
    throttle = report["retry_throttling"]
    if throttle is not None:
        print(f"  throttling: retries and hedges stop at or below {throttle['retries_stop_at_or_below_tokens']} "
              f"of {throttle['max_tokens']} tokens (about {throttle['failures_in_a_row_to_stop']} failures in a "
              f"row), each success adds {throttle['token_ratio']}", file=out)
    print(f"  load balancing: {report['load_balancing']}", file=out)
    od = report["outlier_detection"]
    if od is not None:
        rules = []
        if "success_rate_ejection" in od:
            sr = od["success_rate_ejection"]
            rules.append(f"success rate under mean - {sr['stdev_factor'] / 1000} stdev (hosts with "
                         f"{sr['request_volume']}+ calls, {sr['minimum_hosts']}+ such hosts, enforced "
                         f"{sr['enforcement_percentage']}%)")
        if "failure_percentage_ejection" in od:
            fp = od["failure_percentage_ejection"]
            rules.append(f"over {fp['threshold']}% failed (hosts with {fp['request_volume']}+ calls, "
                         f"{fp['minimum_hosts']}+ hosts, enforced {fp['enforcement_percentage']}%)")
        print(f"  outlier detection: every {od['interval_s']}s, eject on "
              f"{'; or '.join(rules) or 'nothing (no algorithm set: calls are not counted)'}; for "
              f"{od['base_ejection_time_s']}s x ejections in a row, at most {od['max_ejection_time_s']}s; "
              f"at most {od['max_ejection_percent']}% of backends out", file=out)
    if report["health_check_service"] is not None:
        print(f"  health checks: Health/Watch for service {report['health_check_service']!r}", file=out)


def main(path: str, as_json: bool, max_attempts_cap: int, out: Optional[TextIO] = None, *,
         strict: bool = False, retry_budget: Optional[str] = None) -> int:
    """Check the config at `path` ("-": standard input) and print the report. `strict`: a warning fails the check
    too (a CI job that must not publish a config with a misspelt key)."""
    out = out or sys.stdout
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as error:
        print(f"check-config: cannot read {path}: {error}", file=sys.stderr)
        return EXIT_USAGE
    report = check(text, max_attempts_cap, retry_budget)
    failed = not report["valid"] or strict and bool(report["warnings"])
    if as_json:
        print(json.dumps(report, indent=2), file=out)
    else:
        _print_human(report, out)
        if failed and report["valid"]:
            print(f"failed: --strict and {len(report['warnings'])} warning(s)", file=out)
    return EXIT_INVALID if failed else EXIT_VALID
