"""A real grpcio server on loopback whose behaviour a test scripts, attempt by attempt.

Each method of the `grpc_retry.test.Echo` service pops the next step of its script for every attempt it
receives (the default step echoes). The server records what each attempt saw: metadata, requests, and the
order of arrival, so tests assert on what really crossed the wire.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Tuple

import grpc

SERVICE = "grpc_retry.test.Echo"
# An attempt's `ended` is noted in the server's done callback, just after its status has left: a client that
# measures from the status it received may start a moment before it.
SERVER_END_LAG = 0.01
UNARY = f"/{SERVICE}/Unary"
SERVER_STREAM = f"/{SERVICE}/ServerStream"
CLIENT_STREAM = f"/{SERVICE}/ClientStream"
BIDI = f"/{SERVICE}/Bidi"


@dataclass
class Step:
    """What the server does for one attempt.

    code: the status to end with (OK by default). headers: send response headers (these metadata pairs)
    before anything else. responses: how many response messages to send before the status (streaming), or
    None for "echo". trailing: trailing metadata pairs. wait: block (seconds, or until released) first;
    the wait also ends when the attempt itself ends (cancelled by the client, deadline), so a long `wait`
    models "hold the attempt until the client gives up". read: for request streams, how many requests to read
    before going on (None: all, or as `read_all` says). gate: an event to wait for (at most 30 s) after the
    requests were read and before answering. respond: makes the response bytes instead of the echo:
    respond(requests, i) for response number i (unary and client-stream: i = 0, requests = all requests read;
    server-stream and bidi: requests = [the request, or the i-th request]). headers_lead: seconds between the
    headers and what follows (grpc.aio reports headers that arrive with the status as empty).
    """

    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    headers: Optional[Tuple[Tuple[str, str], ...]] = None
    responses: Optional[int] = None
    trailing: Tuple[Tuple[str, str], ...] = ()
    wait: Optional[float] = None
    read_all: bool = True
    read: Optional[int] = None
    gate: Optional[threading.Event] = None
    respond: Optional[Callable[[List[bytes], int], bytes]] = None
    headers_lead: float = 0.0
    hold_after: Optional[int] = None


def fail(code=grpc.StatusCode.UNAVAILABLE, details="scripted failure", **kw) -> Step:
    """A failure before any response: Trailers-Only unless `headers` is given."""
    kw.setdefault("responses", 0)
    kw.setdefault("read_all", False)
    return Step(code=code, details=details, **kw)


def pushback(ms, code=grpc.StatusCode.UNAVAILABLE) -> Step:
    return fail(code, "pushback", trailing=(("grpc-retry-pushback-ms", str(ms)),))


@dataclass
class Attempt:
    """What one attempt looked like on the server. `arrived` / `ended` are time.monotonic() stamps (the
    client runs in the same process, so they compare with its clock); `done` is set when the RPC ended."""

    method: str
    metadata: Dict[str, str]
    requests: List[bytes] = field(default_factory=list)
    cancelled: bool = False
    arrived: float = 0.0
    ended: Optional[float] = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def previous(self) -> Optional[str]:
        """This attempt's grpc-previous-rpc-attempts header (None on a first attempt)."""
        return self.metadata.get("grpc-previous-rpc-attempts")


# How long a first attempt of a `hedges_lose` backend waits for its hedge before it goes on without one.
HEDGE_WAIT = 3.0


class Backend:
    """`hedges_lose`: a server that answers slowly enough that every call is hedged, and whose hedges never win
    (for a hedging policy whose calls must answer as unhedged ones do: the drop-in suite). A first attempt waits
    for a hedge that no other first attempt took, of its method and, with a unary request, of its request (calls
    that overlap must not take each other's), or for its own end (at most HEDGE_WAIT, counted in `unhedged`); then
    it does its step. A hedge (an attempt with grpc-previous-rpc-attempts) takes no step and is held until the
    client cancels it. (A hedge may reach its handler before its first attempt does.) `hedges` counts the hedges
    seen."""

    def __init__(self, workers: int = 32, port: int = 0, health: bool = False, hedges_lose: bool = False):
        self.hedges_lose = hedges_lose
        self.hedges = 0
        self.unhedged = 0
        # hedges no first attempt took, per (method, request: None for request streams)
        self._untaken: Dict[Tuple[str, Optional[bytes]], int] = collections.defaultdict(int)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified on every attempt start / request / end
        self._scripts: Dict[str, Deque[Step]] = collections.defaultdict(collections.deque)
        self._fallbacks: Dict[str, Callable[[int], Step]] = {}
        self._counts: Dict[str, int] = collections.defaultdict(int)
        self.attempts: List[Attempt] = []
        self.release = threading.Event()  # set to let every waiting step go on
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(self._unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(self._server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(self._client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(self._bidi),
        }
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
        # The standard health service (grpcio-health-checking's), when asked for: `health.set(service, status)`.
        self.health = None
        if health:
            from grpc_health.v1 import health as health_service
            from grpc_health.v1 import health_pb2_grpc

            self.health = health_service.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self.target = f"127.0.0.1:{self.port}"
        self._server.start()

    def stop(self):
        self.release.set()
        self._server.stop(None).wait()

    # -- scripting --------------------------------------------------------------------------------------

    def script(self, method: str, *steps: Step) -> None:
        with self._lock:
            self._scripts[method].extend(steps)

    def fallback(self, method: str, choose: Callable[[int], Step]) -> None:
        """When `method`'s script is empty, attempt number i (0-based, per method) does `choose(i)`."""
        with self._lock:
            self._fallbacks[method] = choose

    def attempts_of(self, method: str) -> List[Attempt]:
        with self._lock:
            return [a for a in self.attempts if a.method == method]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        """Block until predicate() (evaluated under the backend's lock) holds; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"backend: timed out after {timeout}s waiting for {what}")
                self._changed.wait(left)

    def wait_attempts(self, method: str, count: int, timeout: float = 10.0) -> List[Attempt]:
        """Block until `method` has seen at least `count` attempts; return them."""
        self.wait_for(lambda: len(self.attempts_of(method)) >= count, timeout, f"{count} attempts of {method}")
        return self.attempts_of(method)

    def wait_ended(self, method: str, count: int, timeout: float = 10.0) -> List[Attempt]:
        """Block until at least `count` attempts of `method` have ended (as the server sees it)."""
        self.wait_for(lambda: sum(1 for a in self.attempts_of(method) if a.ended is not None) >= count, timeout,
                      f"{count} ended attempts of {method}")
        return self.attempts_of(method)

    def wait_all_ended(self, method: str, timeout: float = 10.0) -> List[Attempt]:
        """Block until every attempt of `method` seen so far has ended; return them."""
        return self.wait_ended(method, len(self.attempts_of(method)), timeout)

    def event_when(self, predicate: Callable[[], bool], timeout: float = 10.0) -> threading.Event:
        """An event that a helper thread sets once predicate() holds (or after `timeout`): for request streams
        that must pause until the server has done something (see tests/support/clients.Gate)."""
        event = threading.Event()

        def watch():
            try:
                self.wait_for(predicate, timeout)
            except AssertionError:
                pass
            event.set()

        threading.Thread(target=watch, name="backend-event-when", daemon=True).start()
        return event

    def _on_done(self, attempt: Attempt, context) -> None:
        with self._lock:
            # Cancelled by the client (cancel, deadline, lost connection), not merely over: grpc's sync server
            # says so only in its RPC state (is_active() is False after any end).
            attempt.cancelled = getattr(getattr(context, "_state", None), "client", None) == "cancelled"
            attempt.ended = time.monotonic()
            attempt.done.set()
            self._changed.notify_all()

    def _begin(self, method: str, context, request: Optional[bytes] = None) -> Tuple[Attempt, Optional[Step]]:
        """The attempt, and its step (None: a hedge of a `hedges_lose` backend, held until it ended). `request`:
        a unary request's."""
        attempt = Attempt(method, {k: v for k, v in context.invocation_metadata()}, arrived=time.monotonic())
        with self._lock:
            self.attempts.append(attempt)
            if self.hedges_lose and attempt.previous is not None:
                self.hedges += 1
                self._untaken[method, request] += 1
                self._changed.notify_all()
                step = None
            else:
                step = self._next_step(method)
        if not context.add_callback(lambda: self._on_done(attempt, context)):
            self._on_done(attempt, context)  # already over
        if step is None:
            self._hold(attempt, 0)
            return attempt, None
        if self.hedges_lose:
            self._wait_for_hedge(attempt, (method, request))
        if step.wait is not None:
            self._hold(attempt, step.wait)
        return attempt, step

    def _wait_for_hedge(self, attempt: Attempt, key: Tuple[str, Optional[bytes]]) -> None:
        deadline = time.monotonic() + HEDGE_WAIT
        with self._changed:
            while not self._untaken[key]:
                if attempt.done.is_set() or self.release.is_set():
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    self.unhedged += 1
                    return
                self._changed.wait(left)
            self._untaken[key] -= 1

    def _next_step(self, method: str) -> Step:
        """(Under the lock.) The step of `method`'s next attempt."""
        index = self._counts[method]
        self._counts[method] += 1
        script = self._scripts[method]
        if script:
            step = script.popleft()
        elif method in self._fallbacks:
            step = self._fallbacks[method](index)
        else:
            step = Step()
        self._changed.notify_all()
        return step

    def _hold(self, attempt: Attempt, seconds: float) -> None:
        """Wait `seconds` (0: forever), or until released, or until the attempt has ended."""
        deadline = time.monotonic() + seconds if seconds > 0 else None
        while not (self.release.is_set() or attempt.done.is_set()):
            left = 0.02 if deadline is None else min(0.02, deadline - time.monotonic())
            if left <= 0:
                return
            attempt.done.wait(left)

    def _record(self, attempt: Attempt, request: bytes) -> None:
        with self._lock:
            attempt.requests.append(request)
            self._changed.notify_all()

    def _read(self, attempt: Attempt, request_iterator, step: Step, default_all: bool = True) -> None:
        """Read the requests that `step` asks for (all of them unless it says otherwise)."""
        limit = step.read
        if limit is None and not default_all:
            return
        for request in request_iterator:
            self._record(attempt, request)
            if limit is not None and len(attempt.requests) >= limit:
                return

    @staticmethod
    def _gate(step: Step) -> None:
        if step.gate is not None:
            step.gate.wait(30)

    @staticmethod
    def _end(context, step: Step):
        if step.trailing:
            context.set_trailing_metadata(step.trailing)
        if step.code != grpc.StatusCode.OK:
            context.abort(step.code, step.details)

    @staticmethod
    def _headers(context, step: Step):
        if step.headers is not None:
            context.send_initial_metadata(step.headers)
            if step.headers_lead:
                time.sleep(step.headers_lead)  # the headers travel alone before whatever follows

    # -- handlers (raw bytes) ---------------------------------------------------------------------------

    def _unary(self, request: bytes, context):
        attempt, step = self._begin(UNARY, context, request)
        if step is None:
            return b""
        self._record(attempt, request)
        self._gate(step)
        self._headers(context, step)
        self._end(context, step)
        return step.respond([request], 0) if step.respond else request

    def _server_stream(self, request: bytes, context):
        attempt, step = self._begin(SERVER_STREAM, context, request)
        if step is None:
            return
        self._record(attempt, request)
        self._gate(step)
        self._headers(context, step)
        for i in range(step.responses if step.responses is not None else 3):
            if i == step.hold_after:
                self._hold(attempt, 0)
                if attempt.done.is_set():
                    return
            yield step.respond([request], i) if step.respond else request + b"#%d" % i
        self._end(context, step)

    def _client_stream(self, request_iterator, context):
        attempt, step = self._begin(CLIENT_STREAM, context)
        if step is None:
            return b""
        self._read(attempt, request_iterator, step)
        self._gate(step)
        self._headers(context, step)
        self._end(context, step)
        return step.respond(list(attempt.requests), 0) if step.respond else b"|".join(attempt.requests)

    def _bidi(self, request_iterator, context):
        attempt, step = self._begin(BIDI, context)
        if step is None:
            return
        self._headers(context, step)
        if step.code != grpc.StatusCode.OK and not step.responses:
            self._read(attempt, request_iterator, step, default_all=step.read_all)
            self._gate(step)
            self._end(context, step)
            return
        for i, request in enumerate(request_iterator):
            self._record(attempt, request)
            yield step.respond([request], i) if step.respond else request
            if step.read is not None and len(attempt.requests) >= step.read:
                break
        self._gate(step)
        self._end(context, step)
