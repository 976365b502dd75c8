"""The portable transport's asyncio attempts (grpc_retry/_transport/portable_aio.py), whatever transport this
process chose: each scenario runs in a process of its own with GRPC_RETRY_TRANSPORT=portable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A request stream whose attempt's on_written (the driver's callback, told as each message went) raises: a bug in
# grpc_retry. Prints what the call ended with and what was logged.
_WRITTEN_FAILS = """
import asyncio, json, logging, sys, time
sys.path.insert(0, sys.argv[1])
import grpc
import grpc_retry.aio
from grpc_retry import _transport
from grpc_retry._transport import portable_aio
from support.backend import CLIENT_STREAM, Backend
from support.clients import retry_options

write = portable_aio.AioAttempt.write

def failing_write(attempt, data):
    def on_written():
        raise RuntimeError("a bug in the driver's callback")
    attempt.on_written = on_written
    write(attempt, data)

portable_aio.AioAttempt.write = failing_write
logged = []
handler = logging.Handler()
handler.emit = lambda record: logged.append(
    (record.getMessage(), repr(record.exc_info[1]) if record.exc_info else None))
logging.getLogger("grpc_retry").addHandler(handler)

async def main(backend):
    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as ch:
        started = time.monotonic()
        call = ch.stream_unary(CLIENT_STREAM)(iter([b"a", b"b"]), timeout=5)
        try:
            await call
            code, details = "OK", None
        except grpc.aio.AioRpcError as error:
            code, details = error.code().name, error.details()
        return {"code": code, "details": details, "took": time.monotonic() - started,
                "attempts": len(backend.attempts_of(CLIENT_STREAM)), "logged": logged}
"""


# Each scenario's end: its main(backend) against a fresh backend, what it returns printed with the transport's name.
_MAIN = """
backend = Backend()
try:
    out = asyncio.run(main(backend))
finally:
    backend.stop()
print(json.dumps({"transport": _transport.NAME, **out}))
"""


def _run(script: str) -> dict:
    # (cwd: not a checkout's root, whose source tree would shadow the installed package)
    done = subprocess.run([sys.executable, "-c", script + _MAIN, TESTS], capture_output=True, text=True, timeout=120,
                          cwd=TESTS, env={**os.environ, "GRPC_RETRY_TRANSPORT": "portable"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_request_stream_whose_written_callback_fails_ends_internal_and_says_why():
    """The attempt's writer meets the driver's exception: the call ends INTERNAL at once (not at its deadline,
    with its requests never sent), and the exception is logged with its traceback."""
    out = _run(_WRITTEN_FAILS)
    assert out["transport"] == "portable"
    assert (out["code"], out["details"]) == ("INTERNAL", "grpc_retry internal error")
    assert out["took"] < 4  # its deadline is 5 s away
    assert out["attempts"] <= 1  # INTERNAL is not retryable: no attempt follows (the one may be cancelled unseen)
    failures = [exc for _, exc in out["logged"] if exc is not None]
    assert failures == ["RuntimeError(\"a bug in the driver's callback\")"]


# A client-streaming call whose server answers after the first request, while the application's iterator waits
# for a second that never comes. Prints the call's code and the tasks left once it ended.
_ANSWERED_MID_STREAM = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import grpc_retry.aio
from grpc_retry import _transport
from support.backend import CLIENT_STREAM, Backend, Step
from support.clients import retry_options

def others():
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()
            and "_watch_loop" not in getattr(task.get_coro(), "__qualname__", "")}

async def main(backend):
    backend.script(CLIENT_STREAM, Step(read=1))
    never = asyncio.Event()

    async def requests():
        yield b"a"
        await never.wait()
        yield b"b"

    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as ch:
        before = others()
        code = await asyncio.wait_for(ch.stream_unary(CLIENT_STREAM)(requests(), timeout=5).code(), 5)
        left = others() - before
        if left:  # (grpc.aio's own task for the attempt ends a loop turn or two after its status)
            await asyncio.wait(left, timeout=2)
            left = others() - before
        return {"code": code.name, "left": sorted(getattr(task.get_coro(), "__qualname__", "?") for task in left)}
"""


def test_a_client_stream_answered_before_its_requests_end_leaves_no_writer_waiting():
    """The attempt's writer waits for the next request; the attempt's end stops it, with the call."""
    out = _run(_ANSWERED_MID_STREAM)
    assert (out["transport"], out["code"]) == ("portable", "OK")
    assert out["left"] == []


# A response stream whose attempt reads its first message, then ends UNAVAILABLE: the attempt's read gives the
# message to the driver only after the attempt has told its end (a grpc.aio task hop can order them so). Prints what
# the application got and how many attempts the server saw. argv[2]: "read" reads at once; "headers" awaits the
# call's initial metadata first (the driver then reads ahead).
_READ_TOLD_AFTER_THE_END = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import grpc
import grpc_retry.aio
from grpc_retry import _transport
from grpc_retry._transport import portable_aio
from support.backend import BIDI, Backend, Step
from support.clients import retry_options

read = portable_aio.AioAttempt._read

async def read_told_late(attempt, first=None):
    message = await read(attempt, first)
    await attempt.code()  # its end is told (done callbacks run as its status is set): the message comes after
    return message

portable_aio.AioAttempt._read = read_told_late

async def main(backend):
    backend.script(BIDI, Step(code=grpc.StatusCode.UNAVAILABLE, details="after one", responses=1, read=1))
    async with grpc_retry.aio.insecure_channel(backend.target, options=retry_options()) as ch:
        call = ch.stream_stream(BIDI)(iter([b"a", b"b"]), timeout=5)
        if sys.argv[2] == "headers":
            await call.initial_metadata()
        responses = []
        try:
            async for response in call:
                responses.append(response.decode())
        except grpc.aio.AioRpcError:
            pass
        return {"code": (await call.code()).name, "details": await call.details(), "responses": responses,
                "attempts": len(backend.attempts_of(BIDI))}
"""


@pytest.mark.parametrize("first", ["read", "headers"])
def test_a_first_message_read_as_the_attempt_ends_commits_the_call(first):
    """The message commits the call to its attempt before the attempt's end is judged: the application gets it and
    the attempt's UNAVAILABLE, and no retry (which would give it the retry's messages after it too)."""
    out = _run(_READ_TOLD_AFTER_THE_END.replace("sys.argv[2]", repr(first)))
    assert out["transport"] == "portable"
    assert (out["code"], out["details"], out["responses"], out["attempts"]) == ("UNAVAILABLE", "after one", ["a"], 1)
