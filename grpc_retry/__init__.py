"""grpc_retry: gRFC A6 retries for Python gRPC clients, as a drop-in channel on stock grpcio."""

from grpc_retry._config import ServiceConfigError, ServiceConfigWarning
from grpc_retry.sync import Channel, insecure_channel, secure_channel

__version__ = "0.1.0"

__all__ = ["Channel", "ServiceConfigError", "ServiceConfigWarning", "__version__", "insecure_channel",
           "secure_channel"]
