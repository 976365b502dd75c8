"""The faults suite runs on both APIs, with the integration suite's `client` fixture."""

from integration.conftest import client  # noqa: F401
