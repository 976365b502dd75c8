from __future__ import annotations

from typing import Tuple


def _grpcio_version() -> Tuple[int, ...]:
    import grpc

    return tuple(int(part) for part in grpc.__version__.split(".")[:2])


GRPCIO = _grpcio_version()  # (major, minor) of the grpcio under test, for behaviour that changed between releases
