"""Every program in examples/ runs to completion against its local server (each asserts what it shows)."""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py") and
                                        not f.startswith("_")))
def test_example_runs(name):
    done = subprocess.run([sys.executable, name], cwd=EXAMPLES, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "client:" in done.stdout
