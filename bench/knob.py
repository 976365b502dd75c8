"""A module-level setting of grpc_retry's, A/B'd in one process: client CPU per call of a sync call through
grpc_retry with the setting at each value, and of plain grpcio's (same service config), in alternating rounds;
ratio = median of grpc_retry ÷ grpcio per round. Two builds compared in two runs differ by more than such a change
on a shared machine; one process, one server and one set of connections, alternating, do not.

Example (the timer lanes' reach, issue "No slower than grpcio"):
    python bench/knob.py grpc_retry._timer:LANE_REACH=16,256 --point hedged_unary --inflight 16,128

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from typing import Callable, Dict

import grpc
import overhead


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("knob", help="module:NAME=value,value,... (each value read as the setting's type: a number, "
                                     "a string, or true / false)")
    parser.add_argument("--point", default="hedged_unary", help="one of bench/overhead.py's sync points")
    parser.add_argument("--calls", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--inflight", default="16")
    args = parser.parse_args(argv)
    where, assignment = args.knob.split(":", 1)
    name, values = assignment.split("=", 1)
    module = importlib.import_module(where)
    kind = type(getattr(module, name))
    settings = [value.lower() in ("1", "true", "yes", "on") if kind is bool else kind(value)
                for value in values.split(",")]
    original = getattr(module, name)

    process, port = overhead.start_server()
    no_bdp_process, no_bdp_port = overhead.start_server(overhead.NO_BDP)
    result: dict = {"knob": args.knob, "point": args.point, "calls_per_round": args.calls, "rounds": args.rounds,
                    "grpcio": grpc.__version__}
    try:
        point = overhead._points(port, no_bdp_port)[args.point]
        common = point.get("options", [])
        plain = overhead._sync_channel("plain", common, *point["plain"])
        ours = overhead._sync_channel("ours", common, *point["ours"])
        for inflight in [int(n) for n in args.inflight.split(",")]:
            runs: Dict[str, Callable[[], None]] = {
                "plain": overhead._sync_runner(overhead._sync_one(plain, point["kind"]), args.calls, inflight)}
            for setting in settings:
                run = overhead._sync_runner(overhead._sync_one(ours, point["kind"]), args.calls, inflight)
                runs[str(setting)] = _with(module, name, setting, run)
            samples = overhead._alternate(runs, args.calls, args.rounds)
            result[str(inflight)] = {label: {
                "ratio": round(statistics.median(o / p for o, p in zip(samples[label], samples["plain"], strict=True)),
                               3),
                "us": round(statistics.median(samples[label]) * 1e6, 1)} for label in runs if label != "plain"}
            result[str(inflight)]["plain_us"] = round(statistics.median(samples["plain"]) * 1e6, 1)
        plain.close()
        ours.close()
    finally:
        setattr(module, name, original)
        process.kill()
        no_bdp_process.kill()
    print(json.dumps(result))
    return result


def _with(module, name: str, setting, run: Callable[[], None]) -> Callable[[], None]:
    def with_setting():
        setattr(module, name, setting)
        run()
    return with_setting


if __name__ == "__main__":
    main()
