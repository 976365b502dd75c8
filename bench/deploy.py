"""Deployments: what a fleet's ordinary events do to grpcio's channels and to grpc_retry's, measured side by side
in one run (tests/support/deploy.py): four client processes (grpc, grpc_retry, grpc.aio, grpc_retry.aio) call the
same pods through the same target, round_robin with a retry policy, with every setting at its default except
where a row says otherwise.

- restart: a pod stops gracefully and is back on its address 5 s later: seconds until it answers again.
- replace: one of 3 pods replaced by one at a new address (DNS): seconds until the new pod answers.
- scale_up_age: 2 → 4 pods, old pods with max_connection_age 3 s: seconds until both new pods answer.
- scale_up: 2 → 4 pods, no connection lost: seconds until both new pods answer.
- rolling: 3 pods replaced one by one with surge (new pod in DNS 3 s before the old one leaves DNS, which is
  3 s before it stops: a preStop wait), 7 s apart, grpc_retry with dns_refresh_ms 2000: failed calls. (Slower,
  say 12 s a pod, and grpcio's 30 s floor runs out before its last old pod stops: it then loses nothing either.)
- resources: 200 idle sync channels × 3 addresses, and 1 × 300: threads, idle CPU (% of a core), close time.

Seconds are "never" (null) when the pod got no call before the scenario ended (`--after` s after the change).

Usage: python bench/deploy.py [--only restart,replace,...] [--after 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))

from support import deploy  # noqa: E402
from support.pod import Pod  # noqa: E402

KINDS = ["grpc", "grpc_retry", "grpc.aio", "grpc_retry.aio"]
ROWS = ("restart", "replace", "scale_up_age", "scale_up", "rolling", "resources")


def scenario(name: str, after: float) -> dict:
    if name == "restart":
        settings = deploy.Settings(gap=5.0, after=17.0)
    elif name == "rolling":
        settings = deploy.Settings(refresh_ms=2000, surge=3.0, gap=1.0, after=24.0)
    else:
        settings = deploy.Settings(after=after)
    results = deploy.run(name, KINDS, settings)
    return {r.kind: r.as_dict() for r in results}


def resources() -> dict:
    port = deploy.free_port(["0.0.0.0"])
    pod = Pod("0.0.0.0", port)
    out = {}
    try:
        for channels, addresses in ((200, 3), (1, 300)):
            for kind in ("grpc", "grpc_retry"):
                done = subprocess.run([sys.executable, os.path.join(HERE, os.pardir, "tests", "support",
                                                                    "resources.py"),
                                       kind, str(channels), str(addresses), str(port), "10"],
                                      capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-3000:])
                out[f"{kind} {channels}x{addresses}"] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        pod.kill()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated rows: " + ", ".join(ROWS))
    parser.add_argument("--after", type=float, default=40.0,
                        help="seconds the clients run after a DNS change (grpcio re-resolves no sooner than 30 s)")
    args = parser.parse_args()
    figures = {}
    for name in args.only.split(","):
        figures[name] = resources() if name == "resources" else scenario(name, args.after)
        print(json.dumps({name: figures[name]}), file=sys.stderr, flush=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
