"""Side by side: a scenario through grpcio's channel and through grpc_retry's, each on a fresh server."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, List

from support.backend import Backend


def side_by_side(scenario: Callable[[Callable[..., Any], Backend], Any], ours: Callable[..., Any],
                 theirs: Callable[..., Any]) -> Any:
    """The scenario's observation through grpcio and through ours, each on a fresh server; asserts equality."""
    results = []
    for make in (theirs, ours):
        backend = Backend()
        try:
            results.append(scenario(make, backend))
        finally:
            backend.stop()
    expected, observed = results
    assert observed == expected, _differences(expected, observed)
    return observed


def _differences(expected: Any, observed: Any) -> str:
    """Where a list of observations differs (pytest shows no diff for an assertion outside a test module)."""
    if isinstance(expected, list) and isinstance(observed, list) and len(expected) == len(observed):
        return "\n".join(f"#{i}: grpcio {e!r}\n    ours   {o!r}"
                         for i, (e, o) in enumerate(zip(expected, observed, strict=True)) if e != o)
    return f"grpcio {expected!r}\nours   {observed!r}"


class _ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("grpc"):
            self.seen.append(record.getMessage())


@contextlib.contextmanager
def error_logs() -> Iterator[List[str]]:
    """The error records of grpcio's and grpc_retry's loggers while in it (grpcio logs none for a call it refuses,
    for one)."""
    handler = _ErrorRecords()
    logging.getLogger().addHandler(handler)
    try:
        yield handler.seen
    finally:
        logging.getLogger().removeHandler(handler)
