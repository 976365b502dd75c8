import collections
import faulthandler
import gc
import os
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from support.backend import Backend  # noqa: E402


def _generate_stubs() -> None:
    """Generate the test service's stubs with grpcio-tools, as a user would (never committed)."""
    import grpc_tools
    from grpc_tools import protoc

    out = os.path.join(HERE, "_generated")
    os.makedirs(out, exist_ok=True)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{os.path.join(HERE, 'protos')}", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(HERE, "protos", "echo.proto")])
    assert rc == 0, "protoc failed on tests/protos/echo.proto"
    sys.path.insert(0, out)


_generate_stubs()

# A test whose memory runs away would be killed by the machine with nothing said: the guard stops the run first,
# naming the test and printing every thread's stack and the most numerous objects.
_RSS_LIMIT = int(os.environ.get("GRPC_RETRY_TEST_RSS_LIMIT_MB", "4096")) << 20
_running = ["(between tests)"]
_capture: list = []  # pytest's capture manager: the guard's report goes past it, to the run's own stderr


def pytest_configure(config: pytest.Config) -> None:
    _capture.append(config.pluginmanager.getplugin("capturemanager"))


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _running[0] = nodeid


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _guard_memory() -> None:
    while _rss() < _RSS_LIMIT:
        time.sleep(0.5)
    for capture in _capture:
        if capture is not None:
            capture.suspend_global_capture(in_=False)
    sys.stderr.write(f"\nmemory guard: the tests' process passed {_RSS_LIMIT >> 20} MiB during {_running[0]}\n")
    faulthandler.dump_traceback(all_threads=True)
    counts = collections.Counter(type(thing).__qualname__ for thing in gc.get_objects())
    sys.stderr.write(f"most numerous objects: {counts.most_common(20)}\n")
    sys.stderr.flush()
    os._exit(70)


if os.path.exists("/proc/self/statm"):
    threading.Thread(target=_guard_memory, name="memory-guard", daemon=True).start()


@pytest.fixture
def backend():
    server = Backend()
    yield server
    server.stop()
