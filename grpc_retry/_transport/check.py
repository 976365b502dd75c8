"""The direct transport's self-check: every private name of grpcio it uses (grpc_private.py, direct*.py), looked
up on the installed grpcio, and the parameters of each private function it calls. It imports nothing of the direct
transport: a grpcio whose internals differ must be found out before any of them is used."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, List, Optional, Sequence, Tuple

# (module, attribute path): each must exist.
NAMES: Tuple[Tuple[str, str], ...] = tuple(
    ("grpc._cython.cygrpc", name) for name in (
        "EOF", "AioRpcStatus", "ExecuteBatchError", "ReceiveInitialMetadataOperation", "ReceiveMessageOperation",
        "ReceiveStatusOnClientOperation", "SendCloseFromClientOperation", "SendInitialMetadataOperation",
        "SendMessageOperation", "build_census_context", "execute_batch", "get_working_loop",
        "InitialMetadataFlags.wait_for_ready", "InitialMetadataFlags.wait_for_ready_explicitly_set",
        "PropagationConstants.GRPC_PROPAGATE_DEFAULTS", "OperationType.send_message",
        "OperationType.send_close_from_client", "StatusCode.cancelled", "set_instrumentation_context_on_call_aio",
        "is_fork_support_enabled", "channelz_get_top_channels", "channelz_get_channel", "get_deadline_from_context",
        "AioChannel.call", "SegregatedCall.next_event", "IntegratedCall.operate",
    )
) + tuple(
    ("grpc._channel", name) for name in (
        "Channel", "_RPCState", "_STREAM_UNARY_INITIAL_DUE", "_STREAM_STREAM_INITIAL_DUE",
        "_stream_unary_invocation_operations", "_stream_unary_invocation_operations_and_tags", "_event_handler",
        "_handle_event", "_consume_request_iterator", "_MultiThreadedRendezvous", "_unknown_code_details",
    )
) + (
    ("grpc._compression", "augment_metadata"),
    ("grpc._observability", "_OBSERVABILITY_PLUGIN"),
    ("grpc.aio._channel", "Channel"),
) + tuple(
    ("grpc.aio._interceptor", name) for name in (
        "InterceptedUnaryUnaryCall", "InterceptedUnaryStreamCall", "InterceptedStreamUnaryCall",
        "InterceptedStreamStreamCall", "UnaryUnaryCallResponse", "UnaryStreamCallResponseIterator",
        "StreamStreamCallResponseIterator",
    )
)

# (module, function path, the leading parameters it must take, in order)
PARAMETERS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("grpc._channel", "Channel.__init__", ("self", "target", "options", "credentials", "compression")),
    ("grpc._channel", "_RPCState.__init__", ("self", "due", "initial_metadata", "trailing_metadata", "code",
                                             "details")),
    ("grpc._channel", "_event_handler", ("state", "response_deserializer")),
    ("grpc._channel", "_handle_event", ("event", "state", "response_deserializer")),
    ("grpc._channel", "_consume_request_iterator", ("request_iterator", "state", "call", "request_serializer",
                                                    "event_handler")),
    ("grpc._channel", "_stream_unary_invocation_operations", ("metadata", "initial_metadata_flags")),
    ("grpc._channel", "_stream_unary_invocation_operations_and_tags", ("metadata", "initial_metadata_flags")),
    ("grpc._channel", "_MultiThreadedRendezvous.__init__", ("self", "state", "call", "response_deserializer",
                                                            "deadline")),
    ("grpc.aio._channel", "Channel.__init__", ("self", "target", "options", "credentials", "compression",
                                               "interceptors")),
    ("grpc.aio._channel", "UnaryUnaryMultiCallable._init_metadata", ("metadata", "compression")),
) + tuple(
    ("grpc.aio._interceptor", f"Intercepted{kind}Call.__init__",
     ("self", "interceptors", first, "timeout", "metadata", "credentials", "wait_for_ready", "channel", "method",
      "request_serializer", "response_deserializer", "loop"))
    for kind, first in (("UnaryUnary", "request"), ("UnaryStream", "request"), ("StreamUnary", "request_iterator"),
                        ("StreamStream", "request_iterator"))
)

# What a sync channel and its multicallables hold (made, never connected, then closed), and what grpc.aio's
# multicallables set on themselves (read from their constructors' code: making one needs an event loop).
SYNC_CHANNEL = ("_channel.check_connectivity_state", "_channel.watch_connectivity_state",
                "_channel.segregated_call", "_call_state.managed_calls")
SYNC_MULTICALLABLE = ("_channel", "_managed_call", "_method", "_target", "_context", "_registered_call_handle")
AIO_MULTICALLABLE = ("_channel", "_method", "_loop", "_interceptors")
# (flags, method, host, deadline, metadata, credentials, operations, event_handler, context, registered_call_handle)
MANAGED_CALL_PARAMETERS = 10


def _lookup(root: Any, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _module(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _missing_names(names: Sequence[Tuple[str, str]]) -> List[str]:
    failures = []
    for module_name, path in names:
        module = _module(module_name)
        if module is None:
            failures.append(f"no module {module_name}")
            continue
        try:
            _lookup(module, path)
        except AttributeError:
            failures.append(f"no {module_name}.{path}")
    return failures


def _parameters(function: Callable[..., Any]) -> Tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def _wrong_parameters() -> List[str]:
    failures = []
    for module_name, path, wanted in PARAMETERS:
        module = _module(module_name)
        try:
            found = _parameters(_lookup(module, path))
        except (AttributeError, TypeError, ValueError):
            continue  # (missing: told by _missing_names)
        if found[:len(wanted)] != wanted:
            failures.append(f"{module_name}.{path} takes {found}, not {wanted}")
    return failures


def _sync_objects() -> List[str]:
    failures = []
    try:
        channel = _lookup(_module("grpc._channel"), "Channel")("127.0.0.1:1", (), None, None)
    except Exception as error:  # noqa: BLE001 - whatever a differing grpcio raises is a failed check
        return [f"grpc._channel.Channel(target, options, None, None) raised {error!r}"]
    try:
        for path in SYNC_CHANNEL:
            try:
                _lookup(channel, path)
            except AttributeError:
                failures.append(f"no {path} on a sync channel")
        multicallable = channel.unary_unary("/grpc_retry.Check/Check")
        for name in SYNC_MULTICALLABLE:
            if not hasattr(multicallable, name):
                failures.append(f"no {name} on a sync multicallable")
        managed = getattr(multicallable, "_managed_call", None)
        if managed is not None:
            try:
                count = len(_parameters(managed))
            except (TypeError, ValueError):
                count = -1
            if count != MANAGED_CALL_PARAMETERS:
                failures.append(f"a sync multicallable's _managed_call takes {count} parameters, not "
                                f"{MANAGED_CALL_PARAMETERS}")
    finally:
        channel.close()
    return failures


def _aio_multicallables() -> List[str]:
    module = _module("grpc.aio._channel")
    failures = []
    for kind in ("UnaryUnary", "UnaryStream", "StreamUnary", "StreamStream"):
        cls = getattr(module, f"{kind}MultiCallable", None)
        if cls is None:
            failures.append(f"no grpc.aio._channel.{kind}MultiCallable")
            continue
        assigned = set()
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is not None and hasattr(init, "__code__"):
                assigned.update(init.__code__.co_names)
        failures.extend(f"grpc.aio's {kind}MultiCallable sets no {name}" for name in AIO_MULTICALLABLE
                        if name not in assigned)
    return failures


def interceptor_failures() -> List[str]:
    """What running grpc.aio's interceptors over grpc_retry's calls needs and the installed grpcio lacks."""
    names = [(module, name) for module, name in NAMES if module == "grpc.aio._interceptor"]
    found = _missing_names(names)
    if found:
        return found
    return [failure for failure in _wrong_parameters() if failure.startswith("grpc.aio._interceptor")]


def failures() -> List[str]:
    """What the direct transport needs and the installed grpcio lacks ([]: it can serve)."""
    found = _missing_names(NAMES)
    if found:
        return found
    return _wrong_parameters() + _sync_objects() + _aio_multicallables()
