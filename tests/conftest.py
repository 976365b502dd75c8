import os
import sys

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


@pytest.fixture
def backend():
    server = Backend()
    yield server
    server.stop()
