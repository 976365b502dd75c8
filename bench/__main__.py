"""`python -m bench`: every benchmark, one after the other, against the installed package; prints each one's
figures (one JSON object per line) and a summary line. Each runs as `python bench/<name>.py` in a process of its
own, from outside the source tree, so the uncompiled source never shadows the installed package.

Usage: python -m bench [--quick] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = {  # name: (full arguments, --quick arguments; None: skipped when quick)
    "overhead": (["--calls", "1024", "--rounds", "48"], ["--calls", "64", "--rounds", "2", "--inflight", "4"]),
    "backends": ([], ["--calls", "200"]),
    "hedging": ([], ["--calls", "100"]),
    "hedging_adaptive": (["--adaptive"], None),
    "headers_shape": ([], ["--calls", "64", "--rounds", "2"]),
    "budget": ([], ["--phases", "0.5,0.5,0.5"]),
    "sick_backend": ([], None),  # minutes of calls; tests/integration covers the same behaviours
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small settings: a check that every benchmark runs")
    parser.add_argument("--only", default="", help="comma-separated names: " + ", ".join(SUITE))
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SUITE)
    figures = {}
    for name in names:
        full, quick = SUITE[name]
        if args.quick and quick is None:
            continue
        script = os.path.join(HERE, name.replace("_adaptive", "") + ".py")
        started = time.monotonic()
        done = subprocess.run([sys.executable, script, *(quick if args.quick else full)], cwd=os.path.expanduser("~"),
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(f"bench: {name} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        figures[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps({"benchmark": name, "seconds": round(time.monotonic() - started, 1), **figures[name]}),
              flush=True)
    print(json.dumps({"suite": names, "quick": args.quick, "python": sys.version.split()[0],
                      "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
