"""The direct transport proves, once per process and API, that grpcio hands out completions as its attempts rely on
(grpc_retry/_transport/completions.py): a loopback exchange when the first channel is made. Each case runs in a
process of its own, where no channel was made yet."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from typing import Dict

import pytest

import grpc_retry

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(grpc_retry.__file__)))

# Counts the exchanges, then makes channels of both APIs as an application would: four sync channels at once on
# four threads, and asyncio channels on a loop where grpc.aio already reads its completions (a plain grpc.aio
# call first), each used for a call.
_COUNTED = """
import asyncio, threading
import grpc, grpc_retry, grpc_retry.aio
from grpc_retry._transport import completions

runs = []
real = completions._run
completions._run = lambda api: (runs.append(api), real(api))[1]
server, executor, target = completions._serve()

made = []
barrier = threading.Barrier(4)
def make():
    barrier.wait()
    made.append(grpc_retry.insecure_channel(target))
threads = [threading.Thread(target=make) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
answers = [channel.unary_unary(completions._UNARY)(b"sync", timeout=10) for channel in made]

async def main():
    async with grpc.aio.insecure_channel(target) as plain:
        answers.append(await plain.unary_unary(completions._UNARY)(b"plain", timeout=10))
        channels = [grpc_retry.aio.insecure_channel(target) for _ in range(2)]
        for channel in channels:
            answers.append(await channel.unary_unary(completions._UNARY)(b"aio", timeout=10))
            await channel.close()
asyncio.run(main())
for channel in made:
    channel.close()
server.stop(None)
executor.shutdown()
print(repr((runs, answers)))
"""


def _run(script: str, env: Dict[str, str]) -> subprocess.CompletedProcess[str]:
    # (cwd: the installed package's directory, not a checkout's root, whose source tree would shadow it)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=_PACKAGE_ROOT, env={**os.environ, "PYTHONPATH": _PACKAGE_ROOT, **env})


@pytest.mark.parametrize("transport", ["direct", "portable"])
def test_the_check_runs_once_per_process_and_api_and_passes_on_this_grpcio(transport):
    done = _run(_COUNTED, {"GRPC_RETRY_TRANSPORT": transport})
    assert done.returncode == 0, done.stderr
    runs, answers = ast.literal_eval(done.stdout)
    assert runs == (["sync", "aio"] if transport == "direct" else [])  # the portable transport relies on none
    assert answers == [b"sync"] * 4 + [b"plain"] + [b"aio"] * 2


# A grpcio whose completions do not come as relied upon, stood for by breaking grpc_retry's side of the hand-over
# (plain Python modules: a compiled class takes no patch). BOUND is lowered so that the case takes a second.
_BROKEN = {
    # grpcio's completion queue hands each asyncio batch's completion to a loop that never runs it
    "aio": ("from grpc_retry._transport import batches\n"
            "batches._Batch.call_soon_threadsafe = lambda self, callback, *args: None\n",
            "an asyncio unary attempt's batch completion, handed to it on its loop's thread, waking the task that "
            "awaits its end did not happen within 1s"),
    # grpcio's channel thread never calls a managed call's event handler
    "sync": ("from grpc_retry._transport import direct\n"
             "direct.SyncUnaryAttempt._on_event = lambda self, event: True\n",
             "a unary attempt's end, told by grpcio's channel thread (a managed call's event handler) did not "
             "happen within 1s"),
    # a call's own queue never gives its event: the exchange's thread is stuck inside grpcio for good
    "stuck": ("import threading\n"
              "from grpc_retry._transport import direct\n"
              "direct.sync_unary_end = lambda call, receiving: threading.Event().wait()\n",
              "a blocking unary call's batch event, taken on the caller's thread (next_event) did not happen "
              "within 1s"),
}
_MAKE = """
import time, asyncio
import grpc_retry, grpc_retry.aio
from grpc_retry._transport import completions
completions.BOUND = 1.0
runs = []
real = completions._run
completions._run = lambda api: (runs.append(api), real(api))[1]
{broken}
async def aio_channel():
    return grpc_retry.aio.insecure_channel("127.0.0.1:1")
def make():
    return asyncio.run(aio_channel()) if {api!r} == "aio" else grpc_retry.insecure_channel("127.0.0.1:1")
errors = []
for _ in range(2):
    started = time.monotonic()
    try:
        make()
    except completions.CompletionCheckError as error:
        errors.append((str(error), time.monotonic() - started))
print(repr((runs, errors)))
"""


@pytest.mark.parametrize("case", sorted(_BROKEN))
def test_completions_that_do_not_come_fail_channel_creation_loudly_within_the_bound(case):
    broken, what = _BROKEN[case]
    api = "aio" if case == "aio" else "sync"
    started = time.monotonic()
    done = _run(_MAKE.format(broken=broken, api=api), {"GRPC_RETRY_TRANSPORT": "direct", "GRPC_RETRY_PURE_PYTHON": "1"})
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    runs, errors = ast.literal_eval(done.stdout)
    assert runs == [api]  # the second channel is refused on the first exchange's word
    assert len(errors) == 2 and errors[0][0] == errors[1][0]
    message, took = errors[0]
    assert what in message, message
    assert "GRPC_RETRY_TRANSPORT=portable" in message
    assert took < 1.0 + 1.0 + 1.5  # BOUND, the margin for a stuck exchange, and the server's start and stop
    assert errors[1][1] < 0.1
