"""The Greeter that the snippets of README.md and docs/ call: helloworld.Greeter/SayHello on localhost:50051.

It fails every second attempt it receives (the 1st, the 3rd, ...) with UNAVAILABLE, so that a client's retry shows
in its statistics, and prints each attempt. It loads helloworld.proto when it starts (grpcio-tools' runtime import),
so it runs without the generated code the clients need:

    python examples/helloworld/greeter_server.py [--port 50051] [--fail-every 2]
"""

from __future__ import annotations

import argparse
import itertools
import threading
from concurrent import futures
from typing import Any

import grpc

# Found beside this file: a script's own directory is on sys.path, where grpcio looks for the .proto.
protos, services = grpc.protos_and_services("helloworld.proto")


class Greeter:
    def __init__(self, fail_every: int) -> None:
        self._fail_every = fail_every
        self._count = itertools.count(1)
        self._lock = threading.Lock()

    def SayHello(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            n = next(self._count)
        previous = str(dict(context.invocation_metadata()).get("grpc-previous-rpc-attempts", "0"))
        fail = self._fail_every > 0 and (n - 1) % self._fail_every == 0
        print(f"attempt {n} (grpc-previous-rpc-attempts: {previous}): {'UNAVAILABLE' if fail else 'OK'}", flush=True)
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "failing on purpose: one attempt in every "
                          f"{self._fail_every}")
        return protos.HelloReply(message=f"Hello, {request.name}!")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=50051, help="0: any free port (the one taken is printed)")
    parser.add_argument("--fail-every", type=int, default=2, metavar="N",
                        help="fail one attempt in N with UNAVAILABLE (0: never)")
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    services.add_GreeterServicer_to_server(Greeter(args.fail_every), server)
    port = server.add_insecure_port(f"localhost:{args.port}")
    server.start()
    print(f"Greeter listening on localhost:{port}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(None)


if __name__ == "__main__":
    main()
