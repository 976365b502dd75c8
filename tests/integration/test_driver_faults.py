"""A call ends exactly once even when the driver's own code fails performing what the call machine decided (a bug):
the call ends INTERNAL with grpc_retry's words, at once, where it would otherwise hang (an asyncio call's error
only logged by its loop; a sync future whose end had been decided, which no cancel can end). The fault is put in
the driver's own code, which takes a patch only as plain Python: each case runs in a process of its own with
GRPC_RETRY_PURE_PYTHON=1, on every build."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import grpc_retry

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(grpc_retry.__file__)))

_SCRIPT = """
import asyncio, json, logging, sys, time
from concurrent import futures
import grpc, grpc_retry, grpc_retry.aio
from grpc_retry._compiled import pure_python
from grpc_retry.aio import _driver
from grpc_retry.sync import _driver as _sync_driver

api, action = sys.argv[1], sys.argv[2]
assert pure_python()
logged = []
class Logged(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
logging.getLogger("grpc_retry").addHandler(Logged())

def bug(self, *args):
    raise RuntimeError("a bug performing " + action)
setattr(_driver._Call if api == "aio" else _sync_driver._Driver, action, bug)

server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    "t.S", {"U": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}),))
target = "127.0.0.1:%d" % server.add_insecure_port("127.0.0.1:0")
server.start()
config = json.dumps({"methodConfig": [{"name": [{"service": "t.S"}], "retryPolicy": {
    "maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]})
options = [("grpc.service_config", config)]
started = time.monotonic()

async def aio_call():
    async with grpc_retry.aio.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary("/t.S/U")(b"x", timeout=5)
        try:
            return ["OK", await asyncio.wait_for(call, 10)]
        except grpc.RpcError as error:
            return [error.code().name, error.details()]

if api == "aio":
    outcome = asyncio.run(aio_call())
else:
    with grpc_retry.insecure_channel(target, options=options) as channel:
        future = channel.unary_unary("/t.S/U").future(b"x", timeout=5)
        try:
            outcome = ["OK", future.result(timeout=10)]
        except grpc.RpcError as error:
            outcome = [error.code().name, error.details()]
        outcome.append(future.done())
print(json.dumps({"outcome": [str(part) for part in outcome], "seconds": time.monotonic() - started,
                  "logged": logged}))
server.stop(None)
"""


@pytest.mark.parametrize("api, action", [("sync", "_deliver"), ("sync", "_start"), ("aio", "_deliver"),
                                         ("aio", "_start")])
def test_a_call_whose_driver_fails_performing_an_action_ends_internal_at_once(api: str, action: str) -> None:
    # (cwd: the installed package's directory, not a checkout's root, whose source tree would shadow it)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, api, action], capture_output=True, text=True, timeout=60,
                          cwd=_PACKAGE_ROOT, env={**os.environ, "PYTHONPATH": _PACKAGE_ROOT,
                                                  "GRPC_RETRY_PURE_PYTHON": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    expected = ["INTERNAL", "grpc_retry internal error"] + (["True"] if api == "sync" else [])
    assert report["outcome"] == expected
    assert report["seconds"] < 4  # at once: not at its 5 s deadline, nor hung
    assert any(f"a bug performing {action}" in message or "could not perform" in message
               for message in report["logged"]), report["logged"]
