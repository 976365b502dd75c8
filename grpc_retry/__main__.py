"""`python -m grpc_retry` (and the `grpc-retry` script): tools for service owners and operators."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="grpc-retry", description="grpc_retry's tools.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser(
        "check-config", help="validate a service config as a grpc_retry channel does, and say what it does",
        description="Validate a service config (JSON) exactly as a grpc_retry channel does: print every error and "
                    "warning with its path, then per method the policy, the attempts after the client's cap, "
                    "the backoff bounds per retry (or when hedges are sent), and the throttling threshold. "
                    "Exit status: 0 valid, 1 invalid, 2 usage.")
    check.add_argument("file", help="the config file, or - for standard input")
    check.add_argument("--json", action="store_true", help="print the report as JSON, for machines")
    check.add_argument("--max-attempts", type=int, default=5, metavar="N",
                       help="the client's cap on maxAttempts, as the grpc_retry.max_attempts option (default 5)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's own usage errors exit 2
        return int(exit_.code or 0)
    if args.command == "check-config":
        if args.max_attempts < 1:
            print("check-config: --max-attempts must be at least 1", file=sys.stderr)
            return 2
        from grpc_retry._check_config import main as check_config

        return check_config(args.file, args.json, args.max_attempts)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
