"""install(): grpc's own channel constructors return grpc_retry channels, for channels built where the
application cannot change the constructor (a cloud client library builds its own).

The patch replaces four attributes of the grpc and grpc.aio modules. Code that took a reference to a constructor
before install() (`from grpc import insecure_channel`) keeps grpcio's. grpc_retry's own subchannels are made
from grpcio's channel classes, never through these constructors, so installing never recurses.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import grpc
import grpc.aio

from grpc_retry._options import ENABLE

# grpcio's constructors, as imported: what uninstall() puts back.
grpc_insecure_channel = grpc.insecure_channel
grpc_secure_channel = grpc.secure_channel
grpc_aio_insecure_channel = grpc.aio.insecure_channel
grpc_aio_secure_channel = grpc.aio.secure_channel

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


def _patched(name: str, original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    def constructor(*args: Any, **kwargs: Any) -> Any:
        options = kwargs.get("options")
        if options is None:
            index = 1 if name == "insecure_channel" else 2  # options follows target (and credentials)
            options = args[index] if len(args) > index else None
        return (ours if _wanted(options) else original)(*args, **kwargs)

    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = original.__doc__
    constructor.__wrapped__ = original  # type: ignore[attr-defined]
    return constructor


def _patches() -> Dict[Tuple[Any, str], Callable[..., Any]]:
    import grpc_retry.aio
    import grpc_retry.sync

    return {
        (grpc, "insecure_channel"): _patched("insecure_channel", grpc_insecure_channel,
                                             grpc_retry.sync.insecure_channel),
        (grpc, "secure_channel"): _patched("secure_channel", grpc_secure_channel, grpc_retry.sync.secure_channel),
        (grpc.aio, "insecure_channel"): _patched("insecure_channel", grpc_aio_insecure_channel,
                                                 grpc_retry.aio.insecure_channel),
        (grpc.aio, "secure_channel"): _patched("secure_channel", grpc_aio_secure_channel,
                                               grpc_retry.aio.secure_channel),
    }


def install(all_channels: bool = False) -> None:
    """Make grpc.insecure_channel, grpc.secure_channel and their grpc.aio namesakes return grpc_retry channels
    when their options carry ("grpc_retry.enable", 1), or always with `all_channels=True`; grpcio's channels
    otherwise. Calling it again only changes `all_channels`. ("grpc.enable_retries", 0) still turns retries off
    on a channel, as on grpc_retry's own constructors."""
    global _all_channels
    with _lock:
        if _all_channels is None:
            for (module, name), constructor in _patches().items():
                setattr(module, name, constructor)
        _all_channels = bool(all_channels)


def uninstall() -> None:
    """Put grpcio's constructors back. Channels made meanwhile stay what they are."""
    global _all_channels
    with _lock:
        if _all_channels is None:
            return
        grpc.insecure_channel = grpc_insecure_channel
        grpc.secure_channel = grpc_secure_channel
        grpc.aio.insecure_channel = grpc_aio_insecure_channel
        grpc.aio.secure_channel = grpc_aio_secure_channel
        _all_channels = None
