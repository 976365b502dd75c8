"""The direct transport's asyncio attempts (grpc_retry/_transport): grpc_retry's own calls on grpc.aio's Cython
calls, and grpc.aio's interceptor calls over a grpc_retry call.

grpc.aio runs a call's done callbacks inside the coroutine that sets its status, before a unary response is
returned; so an attempt's end is told from the done callbacks of its own batches, and its status read from the
Cython call.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

from grpc import aio
from grpc._cython import cygrpc

from grpc_retry._transport.batches import _Batch
from grpc_retry._transport.ends import AioAttemptBase, Metadata
from grpc_retry._transport.grpc_private import (
    CORE_ERROR,
    EOF,
    LOCALLY_CANCELLED,
    NO_FLAGS,
    STATUS_CODES,
    WAIT_FOR_READY,
    AioRpcStatus,
    ExecuteBatchError,
    SendCloseFromClientOperation,
    SendMessageOperation,
    build_census_context,
    unary_ops,
)

try:
    from grpc.aio import _interceptor
except ImportError:
    _interceptor = None  # type: ignore[assignment]

# Every asyncio attempt is made on grpc.aio's Cython call directly: no grpc.aio call object, no task and no future,
# only the batches, each told its completion by grpcio's completion queue (`_Batch`). grpc.aio's own calls add a
# Python call object, tasks that run their batches one after another, and a loop turn before the first starts.
# - A unary-unary attempt, unhedged, is one batch, as grpc.aio's.
# - Hedged, it must show its response headers before its response (they commit the call), where grpc.aio's unary
#   call gets both at once and its unary-stream call costs ~1.6x the CPU (four batches, and tasks to drive them):
#   two batches in flight together, the request with the headers and the response with the status.
# - A response stream is read a batch per message, as the reader asks.
# - A request stream sends its metadata in a batch of its own (the call's writes wait for it, as grpc.aio's), then a
#   batch per message and one to half-close, one at a time as the machine hands them out. Its response batch is in
#   flight from the start: the deadline, or a server that ends the call early, reaches the driver at once, where
#   grpc.aio's stream-unary call asks for its status only once the response headers came.


class AioMethod:
    """A method on one subchannel: made from grpc.aio's multicallable of it, it makes `AioAttempt`s, called as that
    multicallable is (with bytes, or None for a request stream). `headers_first`: they show their response headers
    before the response (a response stream's always do); `stream`: a response stream."""

    __slots__ = ("_multicallable", "_handle", "_headers_first", "_stream", "_channel", "_method", "_loop",
                 "_register", "whole")

    def __init__(self, multicallable: Any, headers_first: bool, stream: bool = False) -> None:
        self._multicallable = multicallable  # grpc.aio's multicallable of the method
        handle = getattr(multicallable, "_registered_call_handle", None)  # grpcio 1.71 on
        self._handle = () if handle is None else (handle,)
        self._headers_first = headers_first or stream
        self._stream = stream
        # What each attempt needs of it, read once (they are fixed): its Cython channel, method and loop, and
        # where grpc.aio tracks its calls (1.83 on: its close cancels them), or None.
        self._channel = multicallable._channel
        self._method = multicallable._method
        self._loop = multicallable._loop
        self._register = getattr(getattr(multicallable, "_python_channel", None), "_register_call", None)
        # The method with a unary response as one batch (a hedged call's first attempt: Method.first_whole)
        self.whole = AioMethod(multicallable, False) if headers_first and not stream else self

    def __call__(self, request: Optional[bytes], *, timeout: Optional[float], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any) -> AioAttempt:
        if compression or not isinstance(metadata, tuple):
            metadata = tuple(self._multicallable._init_metadata(metadata, compression))
        deadline = None if timeout is None else time.time() + timeout
        call = self._channel.call(self._method, deadline, credentials, wait_for_ready, *self._handle)
        attempt = AioAttempt(call, self._loop, request, metadata, WAIT_FOR_READY[wait_for_ready],
                             self._headers_first, self._stream)
        if self._register is not None:  # tracked as grpc.aio's own calls are
            self._register(attempt)
        return attempt


class AioResponseStream(AioMethod):
    """A method with a response stream on one subchannel, from grpc.aio's multicallable of it."""

    __slots__ = ()

    def __init__(self, multicallable: Any) -> None:
        super().__init__(multicallable, True, True)


class AioAttempt(AioAttemptBase):
    """One attempt. It tells the driver what happens, from the done callbacks of its batches: `on_headers()` when
    the response headers came (headers first only), `on_end(response or EOF)` when it ended; with a request stream,
    `on_sent()` once its metadata went out and `on_written()` once a message written went. With a response stream,
    read() reads its messages; it is then followed by its done callbacks.
    Building its batches may raise (metadata grpcio cannot send): grpc.aio would raise that from the call.
    Its status and headers, its waiters and done callbacks, and what grpc.aio's channel asks of its calls are kept
    as the portable transport's are (AioAttemptBase)."""

    __slots__ = ("_ops", "_first", "_last", "_end_waits", "_sending", "_writing", "_closing", "_direct")
    refusal = None  # (refused calls raise as they are made)

    def __init__(self, call: Any, loop: asyncio.AbstractEventLoop, request: Optional[bytes], metadata: Metadata,
                 flags: int, headers_first: bool, stream: bool = False) -> None:
        super().__init__(call, loop, request is None)
        self._end_waits: Optional[bool] = None  # a response stream's end, done before its headers were read
        self._sending: Optional[_Batch] = None  # a request stream's metadata, going out
        self._writing: Optional[_Batch] = None  # ... a message of it
        self._closing: Optional[_Batch] = None  # ... its half-close (right behind its last message, maybe)
        context = build_census_context()  # grpcio's observability, as its own calls (None without it)
        if context is not None:
            cygrpc.set_instrumentation_context_on_call_aio(call, context)
        sending, receiving = unary_ops(b"" if request is None else request, metadata, flags)
        headers, message, status = receiving
        if stream:  # its messages are read one batch each, as the reader asks
            message = None
        self._ops: Tuple[Any, ...] = (headers, message, status)  # () once ended
        response = (status,) if message is None else (message, status)
        self._direct = direct = not stream  # (see _Batch)
        if request is None:  # first, for it raises on metadata grpcio cannot send
            self._sending = _Batch(call, sending[:1], loop, direct)
            self._sending.done = self._sent_done
            sending = ()
        # The batch that ends with the status, and (headers first) the one before it
        self._first: Optional[_Batch] = None
        if headers_first:
            # The response's batch now: started only once the headers came, it would end a loop turn later. Both
            # are told as they complete, the headers first (a unary response most often comes with them: the end
            # then follows at once; empty headers commit only if silence follows them: the call machine).
            self._last = _Batch(call, response, loop, direct)
            try:
                self._first = _Batch(call, sending + (headers,), loop, direct)
            except BaseException:
                self._abandon()
                raise
            self._first.done = self._headers_done
        else:
            self._last = _Batch(call, sending + (headers,) + response, loop, direct)
        if stream or not headers_first:
            # A response stream's end is watched from the start: it must come after the reads C-core ended before
            # it (their tasks are woken in that order). A unary response's, headers first, once the headers' batch
            # is read (`_headers_done`): its end is told after the headers anyway, and C-core ends the headers'
            # batch no later than the call.
            self._last.done = self._end_done

    def _sent_done(self) -> None:
        sending, self._sending = self._sending, None
        if sending is None:
            return  # cancelled meanwhile: it ended then
        if sending.finish() and self._status is None:  # else it failed: the end says how
            self._tell_sent()

    def write(self, data: bytes) -> None:
        """Send a message of the request stream: `on_written()` once it went (one that fails is not told: the
        attempt's end is). One message at a time."""
        self._writing = self._send(SendMessageOperation(data, NO_FLAGS), self._written)

    def half_close(self) -> None:
        """Half-close the request stream, after the messages written (even the one still going out)."""
        self._closing = self._send(SendCloseFromClientOperation(NO_FLAGS), self._closed)

    def _send(self, operation: Any, done: Callable[[], None]) -> Optional[_Batch]:
        if self._status is not None:
            return None  # ended: the driver hears (or heard) how
        try:
            batch = _Batch(self._call, (operation,), self._loop, self._direct)
        except ExecuteBatchError:
            return None  # C-core refused it: the call is over, and its status says how
        batch.done = done
        return batch

    def _written(self) -> None:
        writing, self._writing = self._writing, None
        if writing is not None and writing.finish() and self.on_written is not None:
            self.on_written()  # (None: cancelled meanwhile, it ended then)

    def _closed(self) -> None:
        closing, self._closing = self._closing, None
        if closing is not None:
            closing.finish()  # (one that failed: the attempt's end says how)

    def _headers_done(self) -> None:
        first, self._first = self._first, None
        if first is None:
            return  # cancelled meanwhile: it ended then
        end = self._last
        try:
            if first.finish() and self._status is None:  # else it failed before its headers: the end says how
                self._set_headers(self._ops[0].initial_metadata())
                # Empty headers with the end already here need no telling: the end tells all.
                if self.on_headers is not None and (self._initial_metadata or not end.completed()):
                    self.on_headers()
        finally:
            if self._ops:  # (else cancelled meanwhile, by on_headers' commit say: it ended then)
                if self._end_waits is not None:  # a response stream's end came first, and waited for the headers
                    self._end(self._end_waits)
                elif self._ops[1] is not None:  # a unary response: its end is watched from now on
                    if end.completed():
                        self._end_done()
                    else:
                        end.done = self._end_done

    def _end_done(self) -> None:
        if not self._ops:
            return  # cancelled meanwhile: it ended then
        finished = self._last.finish()
        if self._first is not None:  # a response stream's headers' batch is done too, but not yet read
            self._end_waits = finished
        else:
            self._end(finished)

    def _end(self, finished: bool) -> None:
        response = EOF
        if self._status is None:  # not cancelled meanwhile
            headers, message, status = self._ops
            if not finished:
                self._set_status(AioRpcStatus(13, CORE_ERROR, (), None))
            else:
                self._set_headers(headers.initial_metadata())
                code = status.code()
                if code not in STATUS_CODES:  # a code gRPC does not define: UNKNOWN, as newer grpcio reads it
                    code = 2
                self._set_status(AioRpcStatus(code, status.details(), status.trailing_metadata(),
                                                     status.error_string()))
                if code == 0 and message is not None:
                    received = message.message()
                    if received is not None:
                        response = received
        self._ops = ()
        # Ended, it needs its C-core call no more: an ended call the application keeps must not keep the grpc.aio
        # channel open in C-core after its close (its subchannel's state watch ends only then).
        self._call = None
        self._tell_end(response)

    def _abandon(self) -> None:
        """Stop waiting for the batches of a cancelled call."""
        for batch in (self._first, self._last, self._sending, self._writing, self._closing):
            if batch is not None:
                batch.abandon()
        self._first = self._sending = self._writing = self._closing = None

    def read(self) -> Optional[Awaitable[Any]]:
        """A response stream's next message: grpcio's own read, to await (it gives EOF once the stream ended), or
        None when the status is in already (as grpc.aio's read: no message after it). Not a coroutine of its own:
        a read per message, and its frame would be one more for each."""
        if self._status is not None:
            return None
        return self._call.receive_serialized_message()  # type: ignore[no-any-return]

    def _cancelled(self) -> None:
        self._call.cancel(LOCALLY_CANCELLED)
        self._set_status(AioRpcStatus(1, LOCALLY_CANCELLED, None, None))
        if self._ops:
            self._abandon()
            self._end(False)


# grpc.aio's interceptor calls (their cancel, done callbacks and response wrapping are what users of interceptors
# see) with a grpc_retry call at the bottom of the chain. The chain itself is run here: grpcio runs it in a
# method in some releases and in a closure in others, so neither can be overridden across the range.


def _unary_response(self: Any, result: Any) -> Any:
    return result if isinstance(result, aio.UnaryUnaryCall) else _interceptor.UnaryUnaryCallResponse(result)


def _stream_response(call_class: type, iterator_class: type) -> Callable[[Any, Any], Any]:
    def wrap(self: Any, result: Any) -> Any:
        if not isinstance(result, call_class):  # an interceptor that returned an iterator of responses
            result = iterator_class(self._last_returned_call_from_interceptors, result)
        self._last_returned_call_from_interceptors = result
        return result
    return wrap


def _intercepted_kinds() -> Dict[str, Tuple[type, str, Callable[[Any, Any], Any]]]:
    return {
        "unary_unary": (_interceptor.InterceptedUnaryUnaryCall, "intercept_unary_unary", _unary_response),
        "unary_stream": (_interceptor.InterceptedUnaryStreamCall, "intercept_unary_stream",
                         _stream_response(aio.UnaryStreamCall, _interceptor.UnaryStreamCallResponseIterator)),
        "stream_unary": (_interceptor.InterceptedStreamUnaryCall, "intercept_stream_unary",
                         lambda self, result: result),
        "stream_stream": (_interceptor.InterceptedStreamStreamCall, "intercept_stream_stream",
                          _stream_response(aio.StreamStreamCall, _interceptor.StreamStreamCallResponseIterator)),
    }


def aio_intercepted(kind: str) -> type:
    """grpc.aio's intercepted call class for `kind`, made as `cls(multicallable, request, timeout, metadata,
    credentials, wait_for_ready, compression)`; the multicallable's `_make` makes the call at the bottom."""
    base, intercept, wrap = _intercepted_kinds()[kind]

    class Intercepted(base):  # type: ignore[misc, valid-type]
        def __init__(self, multicallable: Any, request: Any, timeout: Optional[float], metadata: Any, credentials: Any,
                     wait_for_ready: Optional[bool], compression: Any) -> None:
            self._retry_multicallable = multicallable
            self._retry_compression = compression
            if not isinstance(metadata, aio.Metadata):  # interceptors get a grpc.aio.Metadata, as from grpc.aio
                metadata = aio.Metadata.from_tuple(tuple(metadata or ()))
            self._last_returned_call_from_interceptors = None
            method = multicallable._method  # interceptors see it as bytes, as grpc.aio gives it
            super().__init__(multicallable._interceptors, request, timeout, metadata, credentials, wait_for_ready,
                             None, method if isinstance(method, bytes) else method.encode(), None, None,
                             asyncio.get_running_loop())

        async def _invoke(self, interceptors: Any, method: Any, timeout: Optional[float], metadata: Any,
                          credentials: Any, wait_for_ready: Optional[bool], request: Any, *serializers: Any) -> Any:
            async def run(index: int, details: Any, request: Any) -> Any:
                if index < len(interceptors):
                    result = await getattr(interceptors[index], intercept)(functools.partial(run, index + 1),
                                                                          details, request)
                    return wrap(self, result)
                call = self._retry_multicallable._make(request, details.timeout, details.metadata,
                                                       details.credentials, details.wait_for_ready,
                                                       self._retry_compression)
                self._last_returned_call_from_interceptors = call
                return call

            details = aio.ClientCallDetails(method, timeout, metadata, credentials, wait_for_ready)
            return await run(0, details, request)

        def time_remaining(self) -> Optional[float]:
            return None

    Intercepted.__name__ = Intercepted.__qualname__ = base.__name__
    return Intercepted


_RESPONSE_STREAMS = ("unary_stream", "stream_stream")


class AioAttempts:
    """Every asyncio attempt is grpc_retry's own (AioAttempt): a unary response's made by AioMethod (headers first
    when hedged), a response stream's by AioResponseStream."""

    watch_spacing = 1  # (headers first costs a second batch)

    @staticmethod
    def shape(kind: str, hedged: bool) -> Tuple[str, bool, bool]:
        unary_response = kind not in _RESPONSE_STREAMS
        return kind, unary_response, hedged and unary_response

    @staticmethod
    def method(channel: Any, name: str, shape: Tuple[str, bool, bool], owner: Any) -> Any:
        multicallable = getattr(channel, shape[0])(name)
        return AioMethod(multicallable, shape[2]) if shape[1] else AioResponseStream(multicallable)
