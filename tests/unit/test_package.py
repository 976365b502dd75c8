"""The package's face: real exports (a typo is an AttributeError and a mypy error), the version it declares."""

import importlib.metadata

import grpc

import grpc_retry


def test_exports_and_version():
    assert grpc_retry.__version__ == importlib.metadata.version("grpc_retry")
    assert issubclass(grpc_retry.Channel, grpc.Channel)
    assert set(grpc_retry.__all__) <= set(dir(grpc_retry))
    assert not hasattr(grpc_retry, "insecure_chanel") and not hasattr(grpc_retry, "__getattr__")
