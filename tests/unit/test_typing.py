"""The typed API: mypy --strict accepts grpc_retry's own code and rejects misuses of it (tests/typing/misuse.py,
whose every line with an E: comment must be reported, and no other)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISUSE = os.path.join(ROOT, "tests", "typing", "misuse.py")


def mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", *paths], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_mypy_rejects_each_misuse_and_nothing_else() -> None:
    done = mypy(MISUSE)
    assert done.returncode == 1, done.stdout + done.stderr
    reported = {int(m.group(1)) for m in re.finditer(r"misuse\.py:(\d+): error:", done.stdout)}
    with open(MISUSE) as source:
        marked = {n for n, line in enumerate(source, 1) if "# E:" in line}
    assert len(marked) >= 8
    assert reported == marked, done.stdout
