"""The "did you mean" of every message about a name grpc_retry does not know: the known name closest to it."""

from __future__ import annotations

import difflib
from typing import Iterable, Optional

CUTOFF = 0.6  # difflib's default similarity: catches a dropped, doubled or swapped letter in a short name


def closest(name: str, known: Iterable[str], cutoff: float = CUTOFF) -> Optional[str]:
    """The known name closest to `name`, as `known` spells it, or None when none is close. Case is ignored:
    `unavailable` is taken for `UNAVAILABLE`."""
    by_folded = {k.lower(): k for k in known}
    near = difflib.get_close_matches(name.lower(), list(by_folded), n=1, cutoff=cutoff)
    return by_folded[near[0]] if near else None


def did_you_mean(name: str, known: Iterable[str], cutoff: float = CUTOFF) -> str:
    """' (did you mean 'X'?)' naming the known name closest to `name`, or '' when none is close."""
    return hint(closest(name, known, cutoff))


def hint(near: Optional[str]) -> str:
    """' (did you mean 'X'?)' for a name found by closest(), or '' for None."""
    return "" if near is None else f" (did you mean {near!r}?)"
