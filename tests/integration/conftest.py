"""Fixtures: `client` runs an integration test once per grpc_retry API (tests/support/clients.py); `backends`
starts three loopback servers."""

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
