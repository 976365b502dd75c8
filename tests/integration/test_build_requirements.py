"""What building and installing grpc_retry needs resolves to binary wheels on every Python it declares, 3.10 to 3.14:
no compiler is needed for its tools (grpcio-tools from source is many minutes of C++), only for its own core."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

tomllib = pytest.importorskip("tomllib")  # (Python 3.11 and later; CI reads the file there)

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]


def _project() -> Dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f))


def test_the_classifiers_name_each_python_declared():
    project = _project()["project"]
    assert project["requires-python"] == ">=3.10"
    named = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
             if c.startswith("Programming Language :: Python :: 3.")]
    assert named == PYTHONS


@pytest.mark.slow
@pytest.mark.parametrize("python", PYTHONS)
def test_build_and_install_requirements_are_wheels(python: str, tmp_path: Path) -> None:
    project = _project()
    requirements: List[str] = project["build-system"]["requires"] + project["project"]["dependencies"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(tmp_path),
         "--python-version", python, "--only-binary", ":all:", *requirements],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_CONSTRAINT": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(os.listdir(tmp_path))
    assert files and all(name.endswith(".whl") for name in files), files
    tag = "cp" + python.replace(".", "")
    # The two with C inside: a wheel for this very Python (grpcio-tools has no stable-ABI wheel).
    for name in ("grpcio_tools-", "grpcio-"):
        (wheel,) = [f for f in files if f.startswith(name)]
        assert f"-{tag}-" in wheel, wheel
