"""A library writes nothing on stderr unasked: a call to a name that does not resolve prints what grpcio's own
channel prints (grpcio's C-core log is grpcio's business), and nothing of grpc_retry's."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

TARGET = "dns:///no-such-host.invalid:50051"  # .invalid never resolves (RFC 2606)

SYNC = f"""
import grpc, {{module}}
channel = {{module}}.insecure_channel({TARGET!r})
try:
    channel.unary_unary("/pkg.Svc/Method")(b"x", timeout=2)
except grpc.RpcError as error:
    print(error.code())
channel.close()
"""

AIO = f"""
import asyncio, grpc, {{module}}
async def main():
    channel = {{module}}.insecure_channel({TARGET!r})
    try:
        await channel.unary_unary("/pkg.Svc/Method")(b"x", timeout=2)
    except grpc.RpcError as error:
        print(error.code())
    await channel.close()
asyncio.run(main())
"""


def run(script: str, tmp_path: Any, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_RETRY_TRACE"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**environment, **env})  # not the source tree: the installed package


@pytest.mark.parametrize("script, grpcio, ours", [(SYNC, "grpc", "grpc_retry"), (AIO, "grpc.aio", "grpc_retry.aio")],
                         ids=["sync", "aio"])
def test_an_unresolvable_name_prints_no_more_than_grpcio_does(script: str, grpcio: str, ours: str,
                                                              tmp_path: Any) -> None:
    plain = run(script.format(module=grpcio), tmp_path)
    done = run(script.format(module=ours), tmp_path)
    assert plain.stdout == done.stdout == "StatusCode.UNAVAILABLE\n", (plain.stderr, done.stderr)
    assert "grpc_retry" not in done.stderr and done.stderr == plain.stderr
    traced = run(script.format(module=ours), tmp_path, GRPC_RETRY_TRACE="1")  # asked for: then it is said
    assert "DNS resolution of 'no-such-host.invalid' failed" in traced.stderr
