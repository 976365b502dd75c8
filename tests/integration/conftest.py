"""The `client` fixture: every integration test runs once per grpc_retry API, through tests/support/clients.py."""

import pytest
from support.clients import Client, sync_available

SYNC_SKIP = pytest.mark.skipif(not sync_available(), reason="sync channel not built yet")


@pytest.fixture(params=["aio", pytest.param("sync", marks=SYNC_SKIP)])
def client(request):
    c = Client(request.param)
    yield c
    c.close()
