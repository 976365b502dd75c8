"""Fixtures: `client` runs an integration test once per grpc_retry API (tests/support/clients.py); `backends`
starts three loopback servers; `plane`, an xDS control plane serving a Listener, named by the bootstrap of the
process's channels."""

import pytest
from support.backend import Backend
from support.clients import Client


@pytest.fixture(params=["aio", "sync"])
def client(request):
    c = Client(request.param)
    yield c
    c.close()


@pytest.fixture
def backends():
    """Three scriptable grpcio servers on loopback ports."""
    servers = [Backend() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def plane(monkeypatch):
    from support.control_plane import ControlPlane  # (xds-protos: only the tests that use it need it)
    from support.xds_resources import listener

    control_plane = ControlPlane()
    control_plane.set(listener())
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP", raising=False)
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", control_plane.bootstrap("channels"))
    yield control_plane
    control_plane.close()
