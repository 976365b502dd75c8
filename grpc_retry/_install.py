"""install(): grpc's own channel constructors return grpc_retry channels, for channels built where the
application cannot change the constructor (a cloud client library builds its own).

The patch wraps the four constructors of the grpc and grpc.aio modules as they are when install() is called —
grpcio's, or an instrumentation's wrappers of them (OpenTelemetry, Sentry): a channel that is not ours is made by
whatever was there, so other patches keep working. uninstall() puts back exactly what install() found (if a later
patch wrapped ours, ours stays in its chain and only passes through). Code that took a reference to a constructor
before install() (`from grpc import insecure_channel`) keeps it. grpc_retry's own subchannels are made from
grpcio's channel classes, never through these constructors, so installing never recurses.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import grpc
import grpc.aio

from grpc_retry._options import ENABLE

_NAMES = ((grpc, "insecure_channel"), (grpc, "secure_channel"), (grpc.aio, "insecure_channel"),
          (grpc.aio, "secure_channel"))
_lock = threading.Lock()
_all_channels: Optional[bool] = None  # None: not installed


def _wanted(options: Optional[Sequence[Tuple[str, Any]]]) -> bool:
    if _all_channels:
        return True
    enabled: Any = 0
    for item in options or ():
        if isinstance(item, tuple) and len(item) == 2 and item[0] == ENABLE:
            enabled = item[1]  # the last value given wins, as for every channel option
    return bool(enabled)


def _patched(module: Any, name: str, original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    def constructor(*args: Any, **kwargs: Any) -> Any:
        options = kwargs.get("options")
        if options is None:
            index = 1 if name == "insecure_channel" else 2  # options follows target (and credentials)
            options = args[index] if len(args) > index else None
        if _installed.get((module, name)) is not constructor or not _wanted(options):
            return original(*args, **kwargs)  # not ours, or uninstalled while another patch still wraps us
        return ours(*args, **kwargs)

    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = original.__doc__
    constructor.__wrapped__ = original  # type: ignore[attr-defined]
    return constructor


def _ours(module: Any, name: str) -> Callable[..., Any]:
    import grpc_retry.aio
    import grpc_retry.sync

    return getattr(grpc_retry.aio if module is grpc.aio else grpc_retry.sync, name)  # type: ignore[no-any-return]


# What install() found (to put back) and what it installed, per constructor.
_found: Dict[Tuple[Any, str], Callable[..., Any]] = {}
_installed: Dict[Tuple[Any, str], Callable[..., Any]] = {}


def install(all_channels: bool = False) -> None:
    """Make grpc.insecure_channel, grpc.secure_channel and their grpc.aio namesakes return grpc_retry channels
    when their options carry ("grpc_retry.enable", 1), or always with `all_channels=True`; otherwise a channel is
    made by the constructor that was installed when install() was called (grpcio's, or an instrumentation's).
    Calling it again only changes `all_channels`. ("grpc.enable_retries", 0) still turns retries off on a
    channel, as on grpc_retry's own constructors."""
    global _all_channels
    with _lock:
        if _all_channels is None:
            for module, name in _NAMES:
                found = _found[(module, name)] = getattr(module, name)
                patched = _installed[(module, name)] = _patched(module, name, found, _ours(module, name))
                setattr(module, name, patched)
        _all_channels = bool(all_channels)


def uninstall() -> None:
    """Put back the constructors install() found. Channels made meanwhile stay what they are."""
    global _all_channels
    with _lock:
        if _all_channels is None:
            return
        for module, name in _NAMES:
            found, patched = _found.pop((module, name)), _installed.pop((module, name))
            if getattr(module, name) is patched:
                setattr(module, name, found)
        _all_channels = None
