"""The package's version, and the grpcio releases it is tested with."""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

__version__ = "0.1.0"

# The oldest and newest grpcio CI runs the whole suite on. The direct transport reads grpcio's internals, whose
# shape changes between releases: outside this range, where its self-check passes, it has not been seen to work.
TESTED_GRPCIO: Tuple[Tuple[int, int], Tuple[int, int]] = ((1, 70), (1, 85))


def grpcio_minor(version: str) -> Tuple[int, ...]:
    """(major, minor) of a grpcio version string; () if it has none."""
    try:
        return tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return ()


def untested_grpcio(version: str) -> Optional[str]:
    """Why `version` of grpcio is outside the tested range, or None when it is inside."""
    minor = grpcio_minor(version)
    (low, high) = TESTED_GRPCIO
    if len(minor) == 2 and low <= minor <= high:
        return None
    return (f"grpc_retry {__version__} is tested with grpcio {low[0]}.{low[1]} to {high[0]}.{high[1]}, and grpcio "
            f"{version} is installed: it may fail in ways the tests have not seen. Install a tested grpcio, a "
            "grpc_retry release that tests this one, or set GRPC_RETRY_TRANSPORT=portable.")


def warn_if_untested() -> None:
    import grpc

    reason = untested_grpcio(grpc.__version__)
    if reason is not None:
        warnings.warn(reason, RuntimeWarning, stacklevel=5)
