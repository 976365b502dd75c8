"""Transparent retries of hedges (A6 "Transparent Retries"), decided once for both drivers."""

from __future__ import annotations

from typing import Optional, Tuple

from grpc_retry._core import NOT_SENT, HedgingCall, transparent_kind

PARK = -1  # the hedge waits for the subchannels to change


def hedge_again(core: HedgingCall, subchannels, index: int, code: int, details: Optional[str], wait_for_ready,
                now: float) -> Optional[Tuple[int, int]]:
    """Hedge `index` failed with `code`: if the server's application never saw it, it goes again, uncounted. Returns
    None (its failure is an ordinary status), or (address, generation): an address the call has not used, to start
    it on at once; or PARK for a never-sent hedge of a call that waits for ready, to start again once the
    subchannels change after that generation."""
    kind = transparent_kind(code, details)
    if kind < 0:
        return None
    since = subchannels.generation  # before looking, so that no change slips by
    address = subchannels.pick(core.used)
    fresh = address >= 0 and not (core.used >> address) & 1
    if (kind == NOT_SENT and not fresh and not wait_for_ready) or (kind != NOT_SENT and address < 0):
        return None
    if not core.on_transparent(index, kind, now):
        return None
    return (address if kind != NOT_SENT or fresh else PARK), since
