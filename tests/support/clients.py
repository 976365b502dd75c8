"""One synchronous test interface over both grpc_retry APIs, so that one parametrized suite covers both.

`Client("aio")` runs grpc_retry.aio channels on an event loop that lives on a background thread (one per test)
and turns every call into a blocking one with asyncio.run_coroutine_threadsafe. `Client("sync")` uses
grpc_retry.insecure_channel and grpc's sync call API as an application would: `multicallable(...)`,
`.with_call(...)`, `.future(...)`, response iterators, and `grpc.RpcError` with code() / details() /
initial_metadata() / trailing_metadata().

    ch = client.channel(backend.target, options)
    out = ch.unary(UNARY, b"x", timeout=5)          # Outcome: code, response(s), details, metadata
    h = ch.start_unary(UNARY, b"x")                 # a running call: h.cancel(), h.result() -> Outcome
    out = ch.client_stream(CLIENT_STREAM, [b"a", Gate(event), b"b"])   # Gate: pause the request stream

Requests and responses are bytes unless (de)serializers are given; `ch.stub()` returns the generated
`echo_pb2_grpc.EchoStub` over the channel, and `ch.invoke(kind, multicallable, payload)` runs any
multicallable (a stub method, an intercepted one) the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, cast

import grpc
import grpc.aio

import grpc_retry
import grpc_retry.aio

RESULT_TIMEOUT = 30.0  # no test call may take longer than this: a hang fails the test instead of the suite
KINDS = ("unary", "server_stream", "client_stream", "bidi")
_FACTORY = {"unary": "unary_unary", "server_stream": "unary_stream", "client_stream": "stream_unary",
            "bidi": "stream_stream"}


@dataclass
class Outcome:
    """How one logical call ended, as the application saw it."""

    code: grpc.StatusCode
    details: Optional[str] = None
    responses: List[Any] = field(default_factory=list)
    initial_metadata: Tuple[Tuple[str, Any], ...] = ()
    trailing_metadata: Tuple[Tuple[str, Any], ...] = ()
    error: Optional[BaseException] = None  # what the API raised (None on success)

    @property
    def response(self) -> Any:
        assert len(self.responses) == 1, f"expected one response, got {self.responses!r} ({self.code})"
        return self.responses[0]

    @property
    def initial(self) -> Dict[str, Any]:
        return dict(self.initial_metadata)

    @property
    def trailing(self) -> Dict[str, Any]:
        return dict(self.trailing_metadata)

    @property
    def previous_attempts(self) -> Optional[str]:
        """The trailing grpc-previous-rpc-attempts the application got (None when absent)."""
        return self.trailing.get("grpc-previous-rpc-attempts")


@dataclass
class Gate:
    """In a request list: wait (at most `timeout` s) for `event` before sending the rest."""

    event: threading.Event
    timeout: float = 10.0


def _pairs(metadata: Any) -> Tuple[Tuple[str, Any], ...]:
    return tuple((k, v) for k, v in (metadata or ()))


def _counting_callback(counter: List[int]) -> Callable[[Any], None]:
    def callback(_call_or_future: Any) -> None:
        counter.append(1)

    return callback


# --------------------------------------------------------------------------------------------------------
# Handles: a running call
# --------------------------------------------------------------------------------------------------------


class Handle:
    """A call in flight. `done_callbacks` counts how often the API ran our done callback."""

    def __init__(self) -> None:
        self.done_callbacks: List[int] = []
        self.call: Any = None  # the API's call object (aio call, sync future / response iterator)
        self._future: concurrent.futures.Future[Outcome]

    def result(self, timeout: float = RESULT_TIMEOUT) -> Outcome:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:  # overridden
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------------
# asyncio
# --------------------------------------------------------------------------------------------------------


class _LoopThread:
    """An event loop running on its own thread; run(coro) blocks until the coroutine's result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="test-aio-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Any, timeout: float = RESULT_TIMEOUT) -> Any:
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[[], Any], timeout: float = RESULT_TIMEOUT) -> Any:
        async def wrapper() -> Any:
            return fn()

        return self.run(wrapper(), timeout)

    def stop(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                _DRAINED.add(task)
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(drain(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self.loop.is_running():
                self.loop.close()


# Tasks the test loop cancelled as it stopped (what Task.cancelling() tells from Python 3.11).
_DRAINED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def _draining(task: asyncio.Task[Any]) -> bool:
    return task in _DRAINED


async def _aio_requests(items: Iterable[Any]) -> Any:
    loop = asyncio.get_running_loop()
    for item in items:
        if isinstance(item, Gate):
            await loop.run_in_executor(None, item.event.wait, item.timeout)
        else:
            yield item


async def _aio_outcome(kind: str, call: Any) -> Outcome:
    responses: List[Any] = []
    try:
        if kind in ("unary", "client_stream"):
            responses.append(await call)
        else:
            async for response in call:
                responses.append(response)
        code = await call.code()
        return Outcome(code, await call.details(), responses, _pairs(await call.initial_metadata()),
                       _pairs(await call.trailing_metadata()))
    except grpc.aio.AioRpcError as error:
        return Outcome(error.code(), error.details(), responses, _pairs(error.initial_metadata()),
                       _pairs(error.trailing_metadata()), error)
    except asyncio.CancelledError as error:
        # grpc.aio raises CancelledError for a call the application cancelled; its status says CANCELLED.
        task = asyncio.current_task()
        # Its task cancelled (the loop draining), not the call: Task.cancelling() says so from Python 3.11.
        cancelling = getattr(task, "cancelling", None)
        if task is not None and (cancelling() if cancelling is not None else _draining(task)):
            raise
        return Outcome(await call.code(), await call.details(), responses, _pairs(await call.initial_metadata()),
                       _pairs(await call.trailing_metadata()), error)


class AioHandle(Handle):
    def __init__(self, loop: _LoopThread) -> None:
        super().__init__()
        self._loop = loop

    def cancel(self) -> bool:
        return bool(self._loop.call(self.call.cancel))


class AioChannel:
    api = "aio"

    def __init__(self, loop: _LoopThread, target: str, options: Any, interceptors: Any, compression: Any) -> None:
        self._loop = loop

        async def make() -> Any:
            return grpc_retry.aio.insecure_channel(target, options=options, compression=compression,
                                                   interceptors=interceptors)

        self.channel = loop.run(make())
        self.raw = self.channel  # what stubs and multicallables are made from

    # -- plumbing -------------------------------------------------------------------------------------

    def run(self, coro: Any, timeout: float = RESULT_TIMEOUT) -> Any:
        """Run a coroutine on this test's loop (for API-specific checks)."""
        return self._loop.run(coro, timeout)

    def multicallable(self, kind: str, method: str, serializer: Any = None, deserializer: Any = None) -> Any:
        return getattr(self.raw, _FACTORY[kind])(method, request_serializer=serializer,
                                                 response_deserializer=deserializer)

    def stub(self) -> Any:
        import echo_pb2_grpc  # type: ignore[import-not-found]  # generated by the test run

        return self._loop.call(lambda: echo_pb2_grpc.EchoStub(self.raw))

    @staticmethod
    def _kwargs(timeout: Any, metadata: Any, wait_for_ready: Any) -> Any:
        return dict(timeout=timeout, metadata=metadata, wait_for_ready=wait_for_ready)

    def start(self, kind: str, multicallable: Any, payload: Any, *, timeout: Any = None, metadata: Any = None,
              wait_for_ready: Any = None) -> Handle:
        handle = AioHandle(self._loop)
        kwargs = self._kwargs(timeout, metadata, wait_for_ready)
        if kind in ("client_stream", "bidi"):
            payload = _aio_requests(payload)

        async def begin() -> Any:
            call = multicallable(payload, **kwargs)
            call.add_done_callback(_counting_callback(handle.done_callbacks))
            return call

        handle.call = self._loop.run(begin())
        handle._future = self._loop.submit(_aio_outcome(kind, handle.call))
        return handle

    def invoke(self, kind: str, multicallable: Any, payload: Any, *, timeout: Any = None, metadata: Any = None,
               wait_for_ready: Any = None, plain: bool = False) -> Outcome:
        """The plain way: await the call (unary) or iterate it (streams), no done callbacks."""
        kwargs = self._kwargs(timeout, metadata, wait_for_ready)
        if kind in ("client_stream", "bidi"):
            payload = _aio_requests(payload)

        async def run() -> Any:
            return await _aio_outcome(kind, multicallable(payload, **kwargs))

        return cast(Outcome, self._loop.run(run()))

    def close(self) -> None:
        self._loop.run(self.channel.close(None))

    # -- uniform helpers ------------------------------------------------------------------------------

    def unary(self, method: Any, request: Any, serializer: Any = None, deserializer: Any = None, **kw: Any) -> Outcome:
        return self.invoke("unary", self.multicallable("unary", method, serializer, deserializer), request, **kw)

    def server_stream(self, method: Any, request: Any, serializer: Any = None, deserializer: Any = None,
                      **kw: Any) -> Outcome:
        return self.invoke("server_stream", self.multicallable("server_stream", method, serializer,
                                                               deserializer), request, **kw)

    def client_stream(self, method: Any, requests: Any, serializer: Any = None, deserializer: Any = None,
                      **kw: Any) -> Outcome:
        return self.invoke("client_stream", self.multicallable("client_stream", method, serializer,
                                                               deserializer), requests, **kw)

    def bidi(self, method: Any, requests: Any, serializer: Any = None, deserializer: Any = None, **kw: Any) -> Outcome:
        return self.invoke("bidi", self.multicallable("bidi", method, serializer, deserializer), requests, **kw)

    def start_call(self, kind: Any, method: Any, payload: Any, serializer: Any = None, deserializer: Any = None,
                   **kw: Any) -> Handle:
        return self.start(kind, self.multicallable(kind, method, serializer, deserializer), payload, **kw)

    @property
    def throttle_tokens(self) -> Optional[float]:
        return cast(Optional[float], self.channel.throttle_tokens)

    @property
    def state(self) -> Any:
        """The channel's ChannelState (pool, throttle, rng)."""
        return self.channel._state


# --------------------------------------------------------------------------------------------------------
# sync
# --------------------------------------------------------------------------------------------------------


def _sync_requests(items: Sequence[Any]) -> Any:
    for item in items:
        if isinstance(item, Gate):
            item.event.wait(item.timeout)
        else:
            yield item


def _sync_error_outcome(error: grpc.RpcError, responses: Any) -> Outcome:
    call = cast(grpc.Call, error)  # grpcio's RpcError is also its grpc.Call
    return Outcome(call.code(), call.details(), responses, _pairs(call.initial_metadata()),
                   _pairs(call.trailing_metadata()), error)


def _sync_stream_outcome(iterator: Any) -> Outcome:
    responses: List[Any] = []
    try:
        for response in iterator:
            responses.append(response)
    except grpc.RpcError as error:
        return _sync_error_outcome(error, responses)
    return Outcome(iterator.code(), iterator.details(), responses, _pairs(iterator.initial_metadata()),
                   _pairs(iterator.trailing_metadata()))


def _sync_future_outcome(future: Any) -> Outcome:
    try:
        response = future.result(RESULT_TIMEOUT)
    except grpc.RpcError as error:
        return _sync_error_outcome(error, [])
    except grpc.FutureCancelledError as error:
        return Outcome(future.code(), future.details(), [], _pairs(future.initial_metadata()),
                       _pairs(future.trailing_metadata()), error)
    return Outcome(future.code(), future.details(), [response], _pairs(future.initial_metadata()),
                   _pairs(future.trailing_metadata()))


class SyncHandle(Handle):
    def cancel(self) -> bool:
        return bool(self.call.cancel())


class SyncChannel:
    api = "sync"

    def __init__(self, target: str, options: Any, interceptors: Any, compression: Any) -> None:
        self.channel = grpc_retry.insecure_channel(target, options=options, compression=compression)
        self.raw = grpc.intercept_channel(self.channel, *interceptors) if interceptors else self.channel
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-sync-call")

    def multicallable(self, kind: str, method: str, serializer: Any = None, deserializer: Any = None) -> Any:
        return getattr(self.raw, _FACTORY[kind])(method, request_serializer=serializer,
                                                 response_deserializer=deserializer)

    def stub(self) -> Any:
        import echo_pb2_grpc

        return echo_pb2_grpc.EchoStub(self.raw)

    @staticmethod
    def _kwargs(timeout: Any, metadata: Any, wait_for_ready: Any) -> Any:
        return dict(timeout=timeout, metadata=metadata, wait_for_ready=wait_for_ready)

    def start(self, kind: str, multicallable: Any, payload: Any, *, timeout: Any = None, metadata: Any = None,
              wait_for_ready: Any = None) -> Handle:
        """Non-blocking: `.future()` for unary responses, the response iterator for streams."""
        handle = SyncHandle()
        kwargs = self._kwargs(timeout, metadata, wait_for_ready)
        if kind in ("client_stream", "bidi"):
            payload = _sync_requests(payload)
        if kind in ("unary", "client_stream"):
            call = handle.call = multicallable.future(payload, **kwargs)
            call.add_done_callback(_counting_callback(handle.done_callbacks))
            handle._future = self._pool.submit(_sync_future_outcome, call)
        else:
            call = handle.call = multicallable(payload, **kwargs)
            call.add_done_callback(_counting_callback(handle.done_callbacks))
            handle._future = self._pool.submit(_sync_stream_outcome, call)
        return handle

    def invoke(self, kind: str, multicallable: Any, payload: Any, *, timeout: Any = None, metadata: Any = None,
               wait_for_ready: Any = None, plain: bool = False) -> Outcome:
        """Blocking, in the calling thread: `.with_call()` for unary responses (with plain=True: the bare
        `multicallable(...)`, whose Outcome then has no metadata), iteration for streams."""
        kwargs = self._kwargs(timeout, metadata, wait_for_ready)
        if kind in ("client_stream", "bidi"):
            payload = _sync_requests(payload)
        if plain and kind in ("unary", "client_stream"):
            try:
                return Outcome(grpc.StatusCode.OK, None, [multicallable(payload, **kwargs)])
            except grpc.RpcError as error:
                return _sync_error_outcome(error, [])
        if kind in ("unary", "client_stream"):
            try:
                response, call = multicallable.with_call(payload, **kwargs)
            except grpc.RpcError as error:
                return _sync_error_outcome(error, [])
            return Outcome(call.code(), call.details(), [response], _pairs(call.initial_metadata()),
                           _pairs(call.trailing_metadata()))
        return _sync_stream_outcome(multicallable(payload, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.channel.close()

    unary = AioChannel.unary
    server_stream = AioChannel.server_stream
    client_stream = AioChannel.client_stream
    bidi = AioChannel.bidi
    start_call = AioChannel.start_call
    throttle_tokens = AioChannel.throttle_tokens
    state = AioChannel.state


# --------------------------------------------------------------------------------------------------------
# the fixture's object
# --------------------------------------------------------------------------------------------------------


class Client:
    """Makes channels of one API and closes them (and the aio loop) at the end of the test."""

    def __init__(self, api: str) -> None:
        assert api in ("aio", "sync"), api
        self.api = api
        self._loop = _LoopThread() if api == "aio" else None
        self._channels: List[Any] = []

    def channel(self, target: str, options: Any = None, *, interceptors: Any = None, compression: Any = None) -> Any:
        ch: Any
        if self._loop is not None:
            ch = AioChannel(self._loop, target, options, interceptors, compression)
        else:
            ch = SyncChannel(target, options, interceptors, compression)
        self._channels.append(ch)
        return ch

    def make_channel(self, target: str, options: Any = None) -> None:
        """Only create the channel (for config errors): what the API's insecure_channel raises, raised."""
        if self._loop is not None:
            async def make() -> Any:
                return grpc_retry.aio.insecure_channel(target, options=options)

            channel = self._loop.run(make())
            self._loop.run(channel.close())
        else:
            grpc_retry.insecure_channel(target, options=options).close()

    def run_in_loop(self, coro: Any, timeout: float = RESULT_TIMEOUT) -> Any:
        assert self._loop is not None, "aio only"
        return self._loop.run(coro, timeout)

    @property
    def loop(self) -> Optional[asyncio.AbstractEventLoop]:
        return None if self._loop is None else self._loop.loop

    # -- interceptors that count logical calls -------------------------------------------------------

    def counting_interceptor(self, add_metadata: Tuple[str, str] = ("x-intercepted", "yes")) -> Any:
        """An interceptor (of this API) for unary-unary and unary-stream calls: it adds `add_metadata` to each
        call it sees and records the call's method in `.calls`."""
        return _AioCounting(add_metadata) if self.api == "aio" else _SyncCounting(add_metadata)

    def close(self) -> None:
        errors = []
        for ch in reversed(self._channels):
            try:
                ch.close()
            except Exception as exc:  # keep closing the others
                errors.append(exc)
        if self._loop is not None:
            self._loop.stop()
        if errors:
            raise errors[0]


def _with_metadata(details: Any, pair: Any) -> Any:
    metadata = tuple(details.metadata or ()) + (pair,)
    return details._replace(metadata=metadata)


class _AioCounting(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, pair: Any) -> None:
        self.pair = pair
        self.calls: List[str] = []

    async def _intercept(self, continuation: Any, details: Any, request: Any) -> Any:
        self.calls.append(details.method)
        details = grpc.aio.ClientCallDetails(details.method, details.timeout,
                                             cast(Any, tuple(details.metadata or ()) + (self.pair,)),
                                             details.credentials, details.wait_for_ready)
        return await continuation(details, request)

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._intercept(continuation, client_call_details, request)

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._intercept(continuation, client_call_details, request)


class _SyncCounting(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, pair: Any) -> None:
        self.pair = pair
        self.calls: List[str] = []

    def _intercept(self, continuation: Any, details: Any, request: Any) -> Any:
        self.calls.append(details.method)
        return continuation(_with_metadata(details, self.pair), request)

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return self._intercept(continuation, client_call_details, request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return self._intercept(continuation, client_call_details, request)


# --------------------------------------------------------------------------------------------------------
# service configs
# --------------------------------------------------------------------------------------------------------

ECHO_SERVICE = "grpc_retry.test.Echo"


def retry_policy(max_attempts: Any = 3, initial: Any = "0.01s", maximum: Any = "0.05s", multiplier: Any = 2,
                 codes: Any = ("UNAVAILABLE",)) -> Any:
    return {"maxAttempts": max_attempts, "initialBackoff": initial, "maxBackoff": maximum,
            "backoffMultiplier": multiplier, "retryableStatusCodes": list(codes)}


def service_config(policy: Any = None, *, name: Any = None, timeout: Any = None, wait_for_ready: Any = None,
                   throttling: Any = None, extra_method_configs: Any = ()) -> str:
    """A service config JSON string: one method config (for the whole Echo service unless `name` is given)."""
    import json

    method_config: Dict[str, Any] = {"name": name if name is not None else [{"service": ECHO_SERVICE}]}
    if policy is not None:
        method_config["retryPolicy"] = policy
    if timeout is not None:
        method_config["timeout"] = timeout
    if wait_for_ready is not None:
        method_config["waitForReady"] = wait_for_ready
    config: Dict[str, Any] = {"methodConfig": [method_config, *extra_method_configs]}
    if throttling is not None:
        config["retryThrottling"] = throttling
    return json.dumps(config)


def retry_options(policy: Any = None, **kw: Any) -> List[Tuple[str, Any]]:
    """Channel options with a service config that retries (by default: 3 attempts on UNAVAILABLE)."""
    extra = kw.pop("options", ())
    return [("grpc.service_config", service_config(policy if policy is not None else retry_policy(), **kw)),
            *extra]
