"""How an attempt reaches grpcio: two transports behind one interface, one of them chosen at import.

- **direct** (`direct.py`, `direct_streams.py`, `direct_aio.py`, `batches.py`; grpcio's private names in
  `grpc_private.py`): attempts on grpcio's Cython calls, their batches built by grpc_retry.
  Fast, and bound to grpcio's private internals: every name it uses is verified on the installed grpcio first
  (`check.py`).
- **portable** (`portable.py`, `portable_aio.py`): grpcio's public API only: multicallables with `None`
  serializers, futures, response iterators, grpc.aio calls. Every grpcio release keeps it; it costs more CPU.

Both are typed as `protocol.Transport` (mypy checks each module against it); what either's attempts leave when
they end is read the same way (`ends.py`). Nothing outside this package imports either module or grpc_private.py.

The direct one serves when its check passes; else the portable one, with one RuntimeWarning naming what failed.
GRPC_RETRY_TRANSPORT=portable forces the portable transport; =direct forces the direct one, and grpc_retry's
import raises ImportError when its check fails.

Each transport has a maker of attempts per API (`SYNC`, `AIO`): `shape(kind, hedged)` tells a method how its
attempts are made (Method reads it once: the grpcio multicallable kind they use; whether they are the transport's
own objects with a unary response; whether they show their response headers before the response, which commit a
hedged call; whether they report their end themselves), and `method(channel, name, shape, owner)` makes the method
on one subchannel that attempts are started through. What an attempt is, per API and call shape:

| API   | call            | direct                                   | portable                                |
|-------|-----------------|------------------------------------------|-----------------------------------------|
| sync  | unary, blocking | one batch on the caller's thread         | grpcio's blocking call                  |
| sync  | unary response  | one batch, its end told on grpcio's thread | grpcio's future, its end read on a worker |
| sync  | unary, hedged   | two batches: the headers, the response   | a unary-stream call, read by a worker*  |
| sync  | response stream | a batch per message read                 | grpcio's response iterator              |
| sync  | request stream  | grpcio's call, its requests sent by a worker | grpcio's call over a request iterator |
| aio   | unary response  | one batch (hedged: headers, then response) | a grpc.aio call (hedged: a stream call) |
| aio   | response stream | a batch per message read                 | a grpc.aio call, read as asked          |
| aio   | request stream  | a batch per message written              | a grpc.aio call's write(), done_writing() |

(*) A blocking hedged call's first attempt is read by its caller: grpcio's future while it may be one batch
(HeadersWatch), else a unary-stream call.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, List, Tuple, Type

import grpc

from grpc_retry._transport import check
from grpc_retry._transport.protocol import Transport

ENV = "GRPC_RETRY_TRANSPORT"
CHOICES = ("direct", "portable")


def choose(wanted: str, failures: List[str]) -> Tuple[str, str]:
    """(the transport, a warning to give or "") for GRPC_RETRY_TRANSPORT=`wanted` and the direct check's
    `failures`. Raises ImportError for a value it does not know, or for `direct` when the check failed."""
    wanted = wanted.strip().lower()
    if wanted and wanted not in CHOICES:
        raise ImportError(f"{ENV}={wanted!r}: expected one of {', '.join(CHOICES)}")
    if wanted == "portable":
        return "portable", ""
    if not failures:
        return "direct", ""
    what = "; ".join(failures)
    if wanted == "direct":
        raise ImportError(f"{ENV}=direct, but grpcio {grpc.__version__} lacks what the direct transport uses: {what}")
    return "portable", (f"grpc_retry: grpcio {grpc.__version__} lacks what the direct transport uses ({what}): "
                        "attempts use grpcio's public API (the portable transport), which costs more CPU per call")


def _select() -> Tuple[str, List[str]]:
    wanted = os.environ.get(ENV, "")
    failures = [] if wanted.strip().lower() == "portable" else check.failures()
    name, warning = choose(wanted, failures)
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=4)
    elif name == "direct":
        from grpc_retry._version import warn_if_untested

        warn_if_untested()  # its check passed, but the direct transport has not been seen to work there
    return name, failures


NAME, FAILURES = _select()

# The chosen transport's module: what the drivers and subchannels call.
if NAME == "direct":
    from grpc_retry._transport import direct

    transport: Transport = direct
else:
    from grpc_retry._transport import portable

    transport = portable


if TYPE_CHECKING:  # each sync method and asyncio attempt class is one
    from grpc_retry._transport import direct_aio, direct_streams, portable_aio
    from grpc_retry._transport.protocol import AioAttempt, BlockingAttempt, SyncMethod, SyncStreamUnaryMethod

    _SYNC_METHODS: Tuple[Type[SyncMethod], ...] = (
        direct.SyncUnary, direct.SyncHeadersFirst, direct_streams.SyncResponseStream, portable.SyncHeadersFirst)
    _STREAM_UNARY_METHODS: Tuple[Type[SyncStreamUnaryMethod], ...] = (
        direct_streams.SyncRequestStream, portable.SyncMethod)
    _BLOCKING_ATTEMPTS: Tuple[Type[BlockingAttempt], ...] = (
        direct_streams.SyncBlockingRequestStream, direct_streams._BlockingFuture, portable.WholeAttempt)
    _AIO_ATTEMPTS: Tuple[Type[AioAttempt], ...] = (direct_aio.AioAttempt, portable_aio.AioAttempt)


def xds_credentials(credentials: grpc.ChannelCredentials) -> bool:
    """Whether `credentials` are grpc.xds_channel_credentials(...)'s (grpc_private.xds_credentials())."""
    from grpc_retry._transport import grpc_private

    return grpc_private.xds_credentials(credentials)


__all__ = ["CHOICES", "ENV", "FAILURES", "NAME", "Transport", "choose", "transport", "xds_credentials"]
