"""grpc_retry: gRFC A6 retries for Python gRPC clients, as a drop-in channel on stock grpcio."""

from grpc_retry import _compiled

_compiled.install()  # first: the compiled modules come from one library (grpc_retry/_compiled.py)

from grpc_retry._config import ServiceConfigError, ServiceConfigWarning  # noqa: E402
from grpc_retry._install import install, uninstall  # noqa: E402
from grpc_retry._stats import MethodStats, ThrottleState  # noqa: E402
from grpc_retry._telemetry import trace_from_environment  # noqa: E402
from grpc_retry._version import __version__  # noqa: E402
from grpc_retry.sync import Channel, insecure_channel, secure_channel  # noqa: E402

__all__ = ["Channel", "MethodStats", "ServiceConfigError", "ServiceConfigWarning", "ThrottleState", "XdsResource",
           "__version__", "insecure_channel", "install", "secure_channel", "uninstall", "xds_status"]

trace_from_environment()  # GRPC_RETRY_TRACE=1: the trace log on stderr
import logging as _logging  # noqa: E402

# A library prints nothing unasked: with no handler, logging's last resort would put our warnings on stderr.
_logging.getLogger("grpc_retry").addHandler(_logging.NullHandler())

# Last: grpc_retry._backends, imported before the channels, would import the portable transport ahead of the sync
# channel it imports from (a cycle).
from grpc_retry._backends.xds.status import XdsResource, xds_status  # noqa: E402
