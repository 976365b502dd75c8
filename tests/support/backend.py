"""A real grpcio server on loopback whose behaviour a test scripts, attempt by attempt.

Each method of the `grpc_retry.test.Echo` service pops the next step of its script for every attempt it
receives (the default step echoes). The server records what each attempt saw: metadata, requests, and the
order of arrival, so tests assert on what really crossed the wire.
"""

from __future__ import annotations

import collections
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

import grpc

SERVICE = "grpc_retry.test.Echo"
UNARY = f"/{SERVICE}/Unary"
SERVER_STREAM = f"/{SERVICE}/ServerStream"
CLIENT_STREAM = f"/{SERVICE}/ClientStream"
BIDI = f"/{SERVICE}/Bidi"


@dataclass
class Step:
    """What the server does for one attempt.

    code: the status to end with (OK by default). headers: send response headers (these metadata pairs)
    before anything else. responses: how many response messages to send before the status (streaming), or
    None for "echo". trailing: trailing metadata pairs. wait: block (seconds, or until released) first.
    """

    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    headers: Optional[Tuple[Tuple[str, str], ...]] = None
    responses: Optional[int] = None
    trailing: Tuple[Tuple[str, str], ...] = ()
    wait: Optional[float] = None
    read_all: bool = True


def fail(code=grpc.StatusCode.UNAVAILABLE, details="scripted failure", **kw) -> Step:
    """A failure before any response: Trailers-Only unless `headers` is given."""
    kw.setdefault("responses", 0)
    kw.setdefault("read_all", False)
    return Step(code=code, details=details, **kw)


def pushback(ms, code=grpc.StatusCode.UNAVAILABLE) -> Step:
    return fail(code, "pushback", trailing=(("grpc-retry-pushback-ms", str(ms)),))


@dataclass
class Attempt:
    method: str
    metadata: Dict[str, str]
    requests: List[bytes] = field(default_factory=list)
    cancelled: bool = False


class Backend:
    def __init__(self, workers: int = 32):
        self._lock = threading.Lock()
        self._scripts: Dict[str, Deque[Step]] = collections.defaultdict(collections.deque)
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
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"
        self._server.start()

    def stop(self):
        self.release.set()
        self._server.stop(None).wait()

    # -- scripting --------------------------------------------------------------------------------------

    def script(self, method: str, *steps: Step) -> None:
        with self._lock:
            self._scripts[method].extend(steps)

    def attempts_of(self, method: str) -> List[Attempt]:
        with self._lock:
            return [a for a in self.attempts if a.method == method]

    def _begin(self, method: str, context) -> Tuple[Attempt, Step]:
        attempt = Attempt(method, {k: v for k, v in context.invocation_metadata()})
        with self._lock:
            self.attempts.append(attempt)
            script = self._scripts[method]
            step = script.popleft() if script else Step()
        context.add_callback(lambda: setattr(attempt, "cancelled", not context.is_active()))
        if step.wait is not None:
            self.release.wait(step.wait if step.wait > 0 else None)
        return attempt, step

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

    # -- handlers (raw bytes) ---------------------------------------------------------------------------

    def _unary(self, request: bytes, context):
        attempt, step = self._begin(UNARY, context)
        attempt.requests.append(request)
        self._headers(context, step)
        self._end(context, step)
        return request

    def _server_stream(self, request: bytes, context):
        attempt, step = self._begin(SERVER_STREAM, context)
        attempt.requests.append(request)
        self._headers(context, step)
        for i in range(step.responses if step.responses is not None else 3):
            yield request + b"#%d" % i
        self._end(context, step)

    def _client_stream(self, request_iterator, context):
        attempt, step = self._begin(CLIENT_STREAM, context)
        for request in request_iterator:
            attempt.requests.append(request)
        self._headers(context, step)
        self._end(context, step)
        return b"|".join(attempt.requests)

    def _bidi(self, request_iterator, context):
        attempt, step = self._begin(BIDI, context)
        self._headers(context, step)
        if step.code != grpc.StatusCode.OK and not step.responses:
            if step.read_all:
                for request in request_iterator:
                    attempt.requests.append(request)
            self._end(context, step)
            return
        for request in request_iterator:
            attempt.requests.append(request)
            yield request
        self._end(context, step)
