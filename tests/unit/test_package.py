"""The package's face: real exports (a typo is an AttributeError and a mypy error), the version it declares."""

import ast
import importlib.metadata
import os
import subprocess
import sys
from typing import Any, Dict, Optional

import grpc

import grpc_retry


def test_exports_and_version():
    assert grpc_retry.__version__ == importlib.metadata.version("grpc_retry")
    assert issubclass(grpc_retry.Channel, grpc.Channel)
    assert set(grpc_retry.__all__) <= set(dir(grpc_retry))
    assert not hasattr(grpc_retry, "insecure_chanel") and not hasattr(grpc_retry, "__getattr__")


def test_the_tested_grpcio_range():
    from grpc_retry._version import TESTED_GRPCIO, untested_grpcio

    (low, high) = TESTED_GRPCIO
    assert untested_grpcio(grpc.__version__) is None  # CI runs the suite on both ends of the range
    assert untested_grpcio(f"{low[0]}.{low[1]}.0") is None and untested_grpcio(f"{high[0]}.{high[1]}.3") is None
    for outside in (f"{low[0]}.{low[1] - 1}.2", f"{high[0]}.{high[1] + 1}.0", "2.0.0", "1.x"):
        reason = untested_grpcio(outside)
        assert reason is not None and f"grpcio {outside} is installed" in reason
        assert f"tested with grpcio {low[0]}.{low[1]} to {high[0]}.{high[1]}" in reason


def test_importing_with_an_untested_grpcio_warns_once(tmp_path):
    """A grpcio outside the range (simulated: its version string changed before grpc_retry is imported)."""
    script = (
        "import warnings, grpc\n"
        "grpc.__version__ = '1.60.0'\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import grpc_retry, grpc_retry.aio\n"
        "    import importlib; importlib.reload(grpc_retry.sync)\n"
        "print([(w.category.__name__, str(w.message)) for w in seen])\n"
    )
    seen = _printed(script, tmp_path, {"GRPC_RETRY_TRANSPORT": ""})  # (the direct transport: its check passes)
    assert len(seen) == 1 and seen[0][0] == "RuntimeWarning", seen
    assert "grpcio 1.60.0 is installed" in seen[0][1]


def test_compiled_modules_come_from_one_library(tmp_path):
    """Every compiled module (setup.py's COMPILED_MODULES and the core) is made from grpc_retry._native, under its
    own name; their .py sources are never imported; a reload of the package adds no second finder."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "setup.py")) as f:
        setup = ast.parse(f.read())
    compiled = next(ast.literal_eval(node.value) for node in setup.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", "") == "COMPILED_MODULES" for t in node.targets))
    script = (
        "import importlib, sys, grpc_retry, grpc_retry.aio\n"
        "from grpc_retry import _native\n"
        "importlib.reload(grpc_retry)\n"
        "finders = [f for f in sys.meta_path if type(f).__name__ == '_Finder']\n"
        "modules = {name: importlib.import_module(name) for name in sorted(_native.NAMES)}\n"
        "print(repr((sorted(_native.NAMES), len(finders), sys.meta_path.index(finders[0]),\n"
        "            {n: (m.__file__ == _native.__file__, m.__name__, type(m.__spec__.loader).__name__)\n"
        "             for n, m in modules.items()},\n"
        "            grpc_retry.sync._call.Call.__module__, grpc_retry.aio._call.UnaryUnaryCall.__module__)))\n"
    )
    names, finders, position, modules, sync_call, aio_call = _printed(script, tmp_path, {"GRPC_RETRY_PURE_PYTHON": ""})
    assert names == sorted(compiled + ["grpc_retry._core"])
    assert finders == 1 and position == 0
    assert modules == {name: (True, name, "_Loader") for name in names}
    assert (sync_call, aio_call) == ("grpc_retry.sync._call", "grpc_retry.aio._call")
    # GRPC_RETRY_PURE_PYTHON=1: the same modules from their .py sources, but the core, which has none
    names, _, _, modules, _, _ = _printed(script, tmp_path, {"GRPC_RETRY_PURE_PYTHON": "1"})
    assert modules == {name: (name == "grpc_retry._core", name, "_Loader" if name == "grpc_retry._core"
                              else "SourceFileLoader") for name in names}


def test_without_opentelemetry_channels_look_for_it_once(tmp_path):
    """OpenTelemetry is optional and imported as a channel is made: where it is not installed (simulated: a finder
    ahead of all says it is not there), the first channel looks for it, the others do not search sys.path again."""
    script = (
        "import sys, grpc_retry, grpc_retry.aio\n"
        "looked = []\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            looked.append(name)\n"
        "            raise ModuleNotFoundError(name)\n"
        "for name in [m for m in sys.modules if m.split('.')[0] == 'opentelemetry']:\n"
        "    del sys.modules[name]\n"
        "sys.meta_path.insert(0, Absent())\n"
        "for _ in range(3):\n"
        "    grpc_retry.insecure_channel('127.0.0.1:1').close()\n"
        "print(repr(looked))\n"
    )
    assert _printed(script, tmp_path) == ["opentelemetry"]


def _printed(script: str, cwd: object, env: Optional[Dict[str, str]] = None) -> Any:
    """What `script`, run by a fresh interpreter (its environment updated with `env`), printed (a literal). cwd: not
    the source tree, whose grpc_retry has no compiled core."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout)


def test_a_source_tree_without_its_core_says_how_to_build_it(tmp_path):
    """Python started in a checkout's root imports its grpc_retry/ ahead of the installed one: where that tree holds
    no compiled core (or one of another Python), the error says so and what to run, not "circular import"."""
    import shutil

    package = os.path.dirname(os.path.abspath(grpc_retry.__file__))
    shutil.copytree(package, tmp_path / "grpc_retry", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    for other in ("", "_native.cpython-39-x86_64-linux-gnu.so"):
        if other:
            (tmp_path / "grpc_retry" / other).write_bytes(b"")
        # (-S: no site-packages, so that an editable install's finder, which would win, is not there either)
        done = subprocess.run([sys.executable, "-S", "-c", "import grpc_retry"], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: grpc_retry's compiled core") and 'pip install -e "."' in last, last
        assert ("built for another Python (_native.cpython-39" in last) == bool(other), last
        assert "circular" not in last
