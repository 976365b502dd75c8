"""The transport is chosen once, at import: direct where its self-check passes, else portable with one warning;
GRPC_RETRY_TRANSPORT forces either (grpc_retry/_transport)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Any, Dict

import pytest

from grpc_retry._transport import check, choose

# A private name the direct transport uses and grpcio's own public calls do not: removed before grpc_retry's import,
# it stands for a grpcio whose internals differ.
_REMOVE = "import grpc._channel\ndel grpc._channel._stream_unary_invocation_operations_and_tags\n"
_REPORT = (
    "import warnings\n"
    "with warnings.catch_warnings(record=True) as seen:\n"
    "    warnings.simplefilter('always')\n"
    "    import grpc_retry, grpc_retry.aio\n"
    "    import importlib; importlib.reload(grpc_retry.sync)\n"
    "from grpc_retry import _transport\n"
    "print(repr((_transport.NAME, _transport.transport.__name__,\n"
    "            [(w.category.__name__, str(w.message)) for w in seen])))\n"
)


def _run(script: str, env: Dict[str, str], cwd: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**os.environ, **env})


def test_the_installed_grpcio_passes_the_direct_check():
    """CI runs the tested grpcio range: there the direct transport serves (the portable run forces the other)."""
    assert check.failures() == []
    assert check.interceptor_failures() == []


def test_choose():
    assert choose("", []) == ("direct", "")
    assert choose("direct", []) == ("direct", "")
    assert choose(" Portable ", []) == ("portable", "")
    assert choose("portable", ["no x"]) == ("portable", "")
    name, warning = choose("", ["no grpc._channel.x", "no y on a sync channel"])
    assert name == "portable"
    assert "no grpc._channel.x; no y on a sync channel" in warning and "portable transport" in warning
    with pytest.raises(ImportError, match="GRPC_RETRY_TRANSPORT=direct, but grpcio .* lacks .*: no x"):
        choose("direct", ["no x"])
    with pytest.raises(ImportError, match="GRPC_RETRY_TRANSPORT='fast': expected one of direct, portable"):
        choose("fast", [])


@pytest.mark.parametrize("forced", ["", "portable"])
def test_a_grpcio_whose_internals_differ_gets_the_portable_transport_and_one_warning(tmp_path, forced):
    done = _run(_REMOVE + _REPORT, {"GRPC_RETRY_TRANSPORT": forced}, tmp_path)
    assert done.returncode == 0, done.stderr
    name, module, seen = ast.literal_eval(done.stdout)
    assert (name, module) == ("portable", "grpc_retry._transport.portable")
    if forced:
        assert seen == []  # asked for: nothing to warn of
    else:
        assert len(seen) == 1 and seen[0][0] == "RuntimeWarning", seen
        assert "no grpc._channel._stream_unary_invocation_operations_and_tags" in seen[0][1]


def test_forcing_the_direct_transport_where_its_check_fails_raises_at_import(tmp_path):
    done = _run(_REMOVE + "import grpc_retry\n", {"GRPC_RETRY_TRANSPORT": "direct"}, tmp_path)
    assert done.returncode != 0
    assert "ImportError: GRPC_RETRY_TRANSPORT=direct, but grpcio" in done.stderr
    assert "no grpc._channel._stream_unary_invocation_operations_and_tags" in done.stderr


def test_the_direct_transport_where_its_check_passes(tmp_path):
    done = _run(_REPORT, {"GRPC_RETRY_TRANSPORT": "direct"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout) == ("direct", "grpc_retry._transport.direct", [])
