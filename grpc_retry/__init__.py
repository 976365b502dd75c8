"""grpc_retry: gRFC A6 retries for Python gRPC clients, as a drop-in channel on stock grpcio."""

from typing import TYPE_CHECKING, Any

from grpc_retry._config import ServiceConfigError, ServiceConfigWarning

__all__ = ["ServiceConfigError", "ServiceConfigWarning", "insecure_channel", "secure_channel"]

if TYPE_CHECKING:  # pragma: no cover
    from grpc_retry.sync import insecure_channel, secure_channel


def __getattr__(name: str) -> Any:
    # The channels pull in the compiled core; keep `import grpc_retry` light and lazy.
    if name in ("insecure_channel", "secure_channel"):
        from grpc_retry import sync

        return getattr(sync, name)
    raise AttributeError(f"module 'grpc_retry' has no attribute {name!r}")
