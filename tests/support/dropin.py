"""Side by side: a scenario through grpcio's channel and through grpc_retry's, each on a fresh server."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, List

from support.backend import Backend

_ATTEMPTS = "grpc-previous-rpc-attempts"


def side_by_side(scenario: Callable[[Callable[..., Any], Backend], Any], ours: Callable[..., Any],
                 theirs: Callable[..., Any]) -> Any:
    """The scenario's observation through grpcio and through ours, each on a fresh server; asserts equality.

    A channel maker marked `hedges` (its policy hedges) runs against a server whose hedges lose (Backend
    `hedges_lose`): no first attempt may wait in vain for its hedge, and the calls answer as grpcio's, but for the
    one difference hedges make on purpose (docs/differences.md): a call that had more than one attempt out says
    so in its trailing metadata (`grpc-previous-rpc-attempts`), left out of that observation."""
    results = []
    for make in (theirs, ours):
        hedged = make is ours and getattr(ours, "hedges", False)
        backend = Backend(hedges_lose=hedged)
        try:
            results.append(scenario(make, backend))
        finally:
            backend.stop()
        if hedged:
            assert backend.unhedged == 0, f"{backend.unhedged} first attempts waited in vain for their hedge"
            results[-1] = _without_attempt_counts(results[-1])
    expected, observed = results
    assert observed == expected, _differences(expected, observed)
    return observed


def _without_attempt_counts(observation: Any) -> Any:
    """The observation without its ("grpc-previous-rpc-attempts", n) metadata pairs (in its lists and tuples)."""
    if type(observation) in (list, tuple):
        return type(observation)(_without_attempt_counts(item) for item in observation
                                 if not (type(item) is tuple and len(item) == 2 and item[0] == _ATTEMPTS))
    return observation


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
