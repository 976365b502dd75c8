"""grpcio's private names and the accessors of its call and channel state, shared by the direct transport
(direct*.py, batches.py), and what grpcio's public API does not tell (xds_credentials()): every use of grpcio's
private internals outside that transport's attempts is here, and nothing outside grpc_retry/_transport/ imports
it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from typing import Any, Callable, Optional, Tuple, cast

import grpc
from grpc._cython import cygrpc

from grpc_retry._transport.ends import AttemptState, decode


def _private(root: Any, path: str) -> Any:
    """A private name of grpcio's, or None where the installed grpcio lacks it. The module imports on any grpcio
    (the portable transport asks it xds_credentials()); the direct transport serves only where grpc_retry/_transport
    /check.py found every name it uses."""
    try:
        for part in path.split("."):
            root = getattr(root, part)
    except AttributeError:
        return None
    return root


try:
    from grpc import _channel, _compression, _observability
    from grpc.aio import _interceptor
except ImportError:
    _channel = _compression = _observability = _interceptor = None  # type: ignore[assignment]

# The names a call uses, bound once: each read of a module's attribute is a lookup.
EOF = grpc.aio.EOF
AioRpcStatus = _private(cygrpc, "AioRpcStatus")
ExecuteBatchError = _private(cygrpc, "ExecuteBatchError")
ReceiveInitialMetadataOperation = _private(cygrpc, "ReceiveInitialMetadataOperation")
ReceiveMessageOperation = _private(cygrpc, "ReceiveMessageOperation")
ReceiveStatusOnClientOperation = _private(cygrpc, "ReceiveStatusOnClientOperation")
SendCloseFromClientOperation = _private(cygrpc, "SendCloseFromClientOperation")
SendInitialMetadataOperation = _private(cygrpc, "SendInitialMetadataOperation")
SendMessageOperation = _private(cygrpc, "SendMessageOperation")
build_census_context = _private(cygrpc, "build_census_context")
execute_batch = _private(cygrpc, "execute_batch")


# -- asyncio attempts -------------------------------------------------------------------------------------------


def aio_working_loop() -> asyncio.AbstractEventLoop:
    """The loop a grpc.aio channel made now binds to: the running one, or (outside a coroutine) grpc.aio's pick."""
    return cast(asyncio.AbstractEventLoop, cygrpc.get_working_loop())


# -- what a call's batches are made of ----------------------------------------------------------------------------

NO_FLAGS = 0
WAIT_FOR_READY = {None: 0, False: _private(cygrpc, "InitialMetadataFlags.wait_for_ready_explicitly_set") or 0,
                   True: (_private(cygrpc, "InitialMetadataFlags.wait_for_ready_explicitly_set") or 0)
                   | (_private(cygrpc, "InitialMetadataFlags.wait_for_ready") or 0)}
STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
LOCALLY_CANCELLED = "Locally cancelled by application!"  # grpc.aio's words, as its own calls' cancel()
CORE_ERROR = "Internal error from Core"
_OK = grpc.StatusCode.OK


def unary_ops(request: bytes, metadata: Any, flags: int) -> Tuple[Tuple[Any, ...], Tuple[Any, Any, Any]]:
    """A unary-unary exchange's operations: (what sends the request and half-closes, (what receives the headers,
    the message, the status))."""
    sending = (SendInitialMetadataOperation(metadata, flags), SendMessageOperation(request, NO_FLAGS),
               SendCloseFromClientOperation(NO_FLAGS))
    return sending, (ReceiveInitialMetadataOperation(NO_FLAGS), ReceiveMessageOperation(NO_FLAGS),
                     ReceiveStatusOnClientOperation(NO_FLAGS))


PROPAGATE_DEFAULTS = _private(cygrpc, "PropagationConstants.GRPC_PROPAGATE_DEFAULTS")
SEND_MESSAGE = _private(cygrpc, "OperationType.send_message")
SEND_CLOSE = _private(cygrpc, "OperationType.send_close_from_client")


# -- sync attempts ----------------------------------------------------------------------------------------------


def sync_direct() -> bool:
    """Whether sync attempts may skip grpcio's Python call layer: not while grpcio's observability plugin (which
    records each of grpcio's own calls from that layer) is registered."""
    return _observability._OBSERVABILITY_PLUGIN is None


def read_status(state: AttemptState, status: Any) -> None:
    """A sync attempt's status, from its received status operation, into its state, as grpcio reads one."""
    code = STATUS_CODES.get(status.code())
    if code is None:  # a code grpcio does not know: UNKNOWN, in grpcio's words
        state.code, state.details = grpc.StatusCode.UNKNOWN, _channel._unknown_code_details(None, status.details())
    else:
        state.code, state.details = code, decode(status.details())
        state.debug_error_string = decode(status.error_string())
    state.trailing_metadata = tuple(status.trailing_metadata() or ())


# -- channels ---------------------------------------------------------------------------------------------------


def new_sync_channel(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                     compression: Optional[grpc.Compression]) -> grpc.Channel:
    """A subchannel: grpcio's own sync channel class, made as grpc.insecure_channel / secure_channel make it —
    never through those constructors, which an instrumentation (or install()) may have replaced."""
    return _channel.Channel(target, tuple(options), _cygrpc_credentials(credentials), compression)


# channelz: which sync subchannel's connection was remade. A channel's channelz id is not told by grpcio: the
# channels made since the last listing are listed, and a subchannel's is the newest one with its target (made
# and listed under one lock, taken for every subchannel grpc_retry makes so; channelz ids grow with creation).
_CHANNELZ_LOCK = threading.Lock()
_channelz_next = 1  # where the next listing starts: every top channel below it was listed before
_SUBCHANNEL_ID = re.compile(rb'"subchannelId":"?([0-9]+)')


def _channelz_after_fork() -> None:
    global _CHANNELZ_LOCK
    _CHANNELZ_LOCK = threading.Lock()  # another thread may have held it as the process forked


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_channelz_after_fork)


def new_sync_channel_with_id(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                             compression: Optional[grpc.Compression]) -> Tuple[grpc.Channel, Optional[int]]:
    """new_sync_channel, and the channel's channelz id (None: not found, as where channelz is off)."""
    global _channelz_next
    with _CHANNELZ_LOCK:
        channel = new_sync_channel(target, options, credentials, compression)
        found = None
        try:
            while True:
                page = json.loads(cygrpc.channelz_get_top_channels(_channelz_next))
                listed = page.get("channel") or ()
                for entry in listed:
                    cid = int(entry["ref"]["channelId"])
                    _channelz_next = max(_channelz_next, cid + 1)
                    if entry.get("data", {}).get("target") == target:
                        found = cid
                if page.get("end", True) or not listed:
                    break
        except (ValueError, KeyError, TypeError):  # not grpcio's channelz as known: no id
            found = None
    return channel, found


def channelz_subchannels(cid: int) -> Optional[Tuple[bytes, ...]]:
    """The channelz ids of the subchannels a sync channel's load balancer holds now (None: the channel is gone).
    Its pick_first makes a new subchannel for each connection it makes after losing one (grpcio 1.70-1.85)."""
    try:
        data = cygrpc.channelz_get_channel(cid)
    except ValueError:
        return None
    return tuple(_SUBCHANNEL_ID.findall(data if isinstance(data, bytes) else data.encode()))


def close_sync_channel(channel: grpc.Channel) -> None:
    channel.close()


def new_aio_channel(target: str, options: Any, credentials: Optional[grpc.ChannelCredentials],
                    compression: Optional[grpc.Compression]) -> grpc.aio.Channel:
    """A subchannel: grpc.aio's own channel class, with no interceptors (see new_sync_channel)."""
    from grpc.aio import _channel

    return cast(grpc.aio.Channel, _channel.Channel(target, tuple(options), _cygrpc_credentials(credentials),
                                                   compression, None))


def _cygrpc_credentials(credentials: Optional[grpc.ChannelCredentials]) -> Any:
    return None if credentials is None else cast(Any, credentials)._credentials


def xds_credentials(credentials: grpc.ChannelCredentials) -> bool:
    """Whether `credentials` are grpc.xds_channel_credentials(...)'s, under which the clusters' TLS of an xDS config
    applies (gRFC A29). True too where this grpcio does not let that be told: the answer that never leaves a
    cluster's TLS unapplied."""
    kind = _private(cygrpc, "XDSChannelCredentials")
    inner = getattr(credentials, "_credentials", None)
    return kind is None or inner is None or isinstance(inner, kind)


def sync_state_reader(channel: Any) -> Callable[[bool], int]:
    """sync_connectivity(channel, ·) without the indirection, for a poller that reads many channels often."""
    return cast(Callable[[bool], int], channel._channel.check_connectivity_state)


def sync_connectivity(channel: Any, try_to_connect: bool) -> int:
    """A sync grpcio channel's connectivity state (grpc.ChannelConnectivity's number); `try_to_connect` starts a
    connection if it is IDLE. grpcio's public way, subscribe(), starts a poller thread of grpcio's own."""
    return int(channel._channel.check_connectivity_state(try_to_connect))


def sync_calls_in_flight(channel: Any) -> int:
    """How many calls a sync grpcio channel has running (those made as futures and streams, as grpc_retry's
    attempts are): the count grpcio keeps to end its channel's spin thread."""
    return int(channel._call_state.managed_calls)


def sync_watch_connectivity(channel: Any, last: int, timeout: float) -> bool:
    """Block until the channel's state differs from `last` (True) or `timeout` passes (False); raises ValueError
    once the channel is closed. While it blocks, the thread polls grpcio: before grpcio's EventEngine clients
    (1.70 among them) nothing else makes a sync channel's connection attempt progress when no call is running."""
    return bool(channel._channel.watch_connectivity_state(last, time.time() + timeout).success)


# -- a call's arguments, as grpcio's Python layer reads them ---------------------------------------------------


def determined(deadline: Optional[float]) -> Optional[float]:
    """grpcio's _determine_deadline(): the sooner of `deadline` and the deadline of the server handler this thread
    runs (propagated), if any; compiled, where grpcio's is a Python function's call on every call's path."""
    parent: Optional[float] = cygrpc.get_deadline_from_context()
    if parent is None:
        return deadline
    return parent if deadline is None else min(parent, deadline)


def augmented_metadata(metadata: Any, compression: Any) -> Any:
    """grpcio's augment_metadata() (the metadata a call sends, with its compression's), its usual case (neither)
    without a Python function's call."""
    if not metadata and not compression:
        return None
    return _compression.augment_metadata(metadata, compression)
