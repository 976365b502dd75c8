"""`python -m grpc_retry` (and the `grpc-retry` script): tools for service owners and operators."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from grpc_retry._options import DEFAULT_MAX_ATTEMPTS


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="grpc-retry", description="grpc_retry's tools.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser(
        "check-config", help="validate a service config as a grpc_retry channel does, and say what it does",
        description="Validate a service config (JSON) exactly as a grpc_retry channel does: print every error and "
                    "warning with its path, then per method the policy, the attempts after the client's cap, "
                    "the backoff bounds per retry (or when hedges are sent), and the throttling threshold. "
                    "Exit status: 0 valid, 1 invalid (with --strict: or any warning), 2 usage.")
    check.add_argument("file", help="the config file, or - for standard input")
    check.add_argument("--strict", action="store_true",
                       help="exit 1 on warnings too (likely mistakes that gRPC accepts, such as a misspelt key): "
                            "for CI")
    check.add_argument("--json", action="store_true", help="print the report as JSON, for machines")
    check.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, metavar="N",
                       help="the client's cap on maxAttempts, as the grpc_retry.max_attempts option (default 5)")
    check.add_argument("--retry-budget", metavar="JSON",
                       help="the grpc_retry.retry_budget option's value: validated, and the budget in force printed")
    demo = commands.add_parser(
        "demo", help="the same workload through grpcio and grpc_retry, side by side",
        description="Start three local backends (separate processes): one healthy, one failing a share of its "
                    "calls with UNAVAILABLE, one holding a share of its calls 200 ms. Run the same unary workload "
                    "through plain grpcio with a retry policy (its own retries) and through grpc_retry with no "
                    "policy, the same retry policy, that retry policy with outlier detection, and a hedging "
                    "policy. Print one table, a row per channel: failed calls, p50 and p99 latency of the calls "
                    "that succeeded, attempts per call, and the share of retries that went to a backend the call "
                    "had not used; then a sentence on each difference. Progress goes to stderr while it runs. The "
                    "progress bar and the terminal table use rich, --plot uses matplotlib: the demo extra, "
                    'installed from the checkout with pip install -e ".[demo]". Without rich, and when piped, '
                    "the table is plain text.")
    demo.add_argument("--calls", type=int, default=2000, metavar="N",
                      help="calls per channel (default 2000, at least 10)")
    demo.add_argument("--concurrency", type=int, default=4, metavar="N", help="calls in flight at once (default 4)")
    demo.add_argument("--sync", action="store_true",
                      help="use the sync API (a thread per call in flight) instead of asyncio")
    demo.add_argument("--plot", metavar="FILE.png",
                      help="also write a chart of the latency tail (matplotlib): the share of calls not answered "
                           "successfully after each latency, log-log, a line per channel")
    demo.add_argument("--fail-share", type=float, default=0.5, metavar="SHARE",
                      help="share of its calls the flaky backend fails with UNAVAILABLE (default 0.5, under 1)")
    demo.add_argument("--slow-share", type=float, default=0.1, metavar="SHARE",
                      help="share of its calls the slow backend holds 200 ms (default 0.1, from 0 to 1)")
    demo.add_argument("--json", action="store_true",
                      help="print the figures as one JSON object, a key per channel, instead of the table and "
                           "sentences")
    status = commands.add_parser(
        "xds-status", help="follow xds: targets and print every resource their xDS servers sent",
        description="Read the xDS bootstrap as grpcio does (GRPC_XDS_BOOTSTRAP, else GRPC_XDS_BOOTSTRAP_CONFIG), "
                    "follow each target from its Listener to its endpoints, and print every resource: type, "
                    "name, status (requested, acked, nacked with the error, does not exist), version and last "
                    "update. Exit status: 0 every resource acked, 1 otherwise, 2 bad input. Needs: "
                    'pip install "grpc_retry[xds]".')
    status.add_argument("targets", nargs="+", metavar="TARGET", help="an xds: target, e.g. xds:///my-service")
    status.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                        help="how long to wait for each target's whole config (default 5)")
    status.add_argument("--json", action="store_true", help="print the resources as JSON, for machines")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's own usage errors exit 2
        return int(exit_.code or 0)
    if args.command == "check-config":
        if args.max_attempts < 1:
            print("check-config: --max-attempts must be at least 1", file=sys.stderr)
            return 2
        from grpc_retry._check_config import main as check_config

        return check_config(args.file, args.json, args.max_attempts, strict=args.strict,
                            retry_budget=args.retry_budget)
    if args.command == "demo":
        if args.calls < 10 or args.concurrency < 1 or not 0 <= args.fail_share < 1 or not 0 <= args.slow_share <= 1:
            print("demo: --calls must be at least 10, --concurrency at least 1, --fail-share in [0, 1), "
                  "--slow-share in [0, 1]", file=sys.stderr)
            return 2
        from grpc_retry._demo import main as demo_main

        return demo_main(args.calls, args.concurrency, args.sync, args.plot, args.fail_share, args.slow_share,
                         args.json)
    if args.command == "xds-status":
        from grpc_retry._backends.xds.status import main as xds_status_main

        return xds_status_main(args.targets, args.wait, args.json)
    parser.print_help()
    return 2


def run() -> None:
    """The command line (`python -m grpc_retry`, the `grpc-retry` script): main(), then exit with its status."""
    code = main()
    if sys.modules.get("grpc_retry._backends.xds.client") is not None:
        # The xDS client's stream was grpcio's: one of grpcio's threads stopped by the interpreter's exit may hold
        # that call's lock, which the call's __del__ then waits on for ever. The work is done: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
