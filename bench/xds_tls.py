"""Mesh TLS on `xds:` channels: client CPU per unary call over mTLS and over plaintext, through grpcio and through
grpc_retry, in one client process, in alternating rounds of one run.

grpc_retry hands a channel made with grpc.xds_channel_credentials(...) whole to grpcio's own xDS client, which makes
the TLS its cluster asks for (gRFC A29); a channel with insecure credentials is served by grpc_retry's own xDS
client. So the TLS a grpc_retry channel pays is grpcio's: its CPU per call over mTLS, over its own over plaintext,
is expected within the same ratio as grpcio's own mTLS over its plaintext (`quotient`, near 1).

One client process (grpcio reads one bootstrap per process: it names one control plane and a file_watcher
certificate provider), three server processes: a control plane (tests/support/control_plane.py) serving two
targets, `xds:///svc-tls`, whose cluster's transport socket asks for mTLS (an UpstreamTlsContext naming the
provider, the backend's SPIFFE ID to match), and `xds:///svc-plain`, whose cluster has none; a grpcio backend that
speaks TLS only and requires a client certificate its CA signed; and a plaintext grpcio backend. Both routes carry
a retry policy on UNAVAILABLE (A44) and every channel the same service config with the same policy: none fires.
The clients, per API:

- `grpcio_tls`: grpc.secure_channel("xds:///svc-tls", grpc.xds_channel_credentials(insecure fallback));
- `grpcio_plain`: grpc.insecure_channel("xds:///svc-plain");
- `ours_tls`: grpc_retry.secure_channel("xds:///svc-tls", the same credentials) (one grpcio channel, whole);
- `ours_plain`: grpc_retry.insecure_channel("xds:///svc-plain") (grpc_retry's own xDS client);
- `ours_whole_plain`: grpc_retry.secure_channel("xds:///svc-plain", the same xDS credentials): the channel kind of
  `ours_tls` (one grpcio channel, whole; the credentials fall back to plaintext) on the plaintext cluster, so that
  `ours_tls` over it is TLS alone, where `ours_tls` over `ours_plain` also compares two kinds of channel.

Each client's CPU per call (`time.process_time()` of the whole process over a round of N calls, one in flight, µs,
median over the rounds; every client warmed up first, the five in a different order each round), and per round the
ratios, whose medians are printed: `ours_tls_vs_grpcio_tls`, `ours_plain_vs_grpcio_plain`, `grpcio_tls_vs_plain`,
`ours_tls_vs_plain`, `quotient` (ours_tls_vs_plain / grpcio_tls_vs_plain), `ours_tls_vs_whole_plain`,
`quotient_whole` (ours_tls_vs_whole_plain / grpcio_tls_vs_plain) and `ours_whole_plain_vs_grpcio_plain`; and the
retry statistics of grpc_retry's channels (no retries). Needs the `xds` extra and openssl.

Prints one JSON object as its last line.
Usage: python bench/xds_tls.py [--calls N] [--rounds R] [--api sync,aio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import grpc
import grpc.experimental

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from envoy.type.matcher.v3 import string_pb2  # noqa: E402
from google.protobuf import duration_pb2, wrappers_pb2  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.pki import SERVER_ID, Pki, file_watcher, make_pki, upstream_tls  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, listener, route_config  # noqa: E402

import grpc_retry  # noqa: E402
import grpc_retry.aio  # noqa: E402

SERVICE = "bench.Echo"
UNARY = f"/{SERVICE}/Unary"
PAYLOAD = b"x" * 64
TARGETS = {"tls": "xds:///svc-tls", "plain": "xds:///svc-plain"}
RETRY_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": SERVICE}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})
OPTIONS = [("grpc.service_config", RETRY_CONFIG)]
NODE = "bench-xds-tls"


# -- the server processes ----------------------------------------------------------------------------------------

def _exit_with_parent() -> None:
    """End this process when the one that started it is gone, however it ended (no server left behind)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def _backend(kind: str, folder: str, ports: Any) -> None:
    """A grpcio server (asyncio) that echoes UNARY: `tls` speaks TLS only and requires a client certificate the CA
    signed; `plain` speaks plaintext."""
    _exit_with_parent()
    pki = Pki(Path(folder))

    async def run() -> None:
        server = grpc.aio.server()

        async def unary(request: bytes, context: Any) -> bytes:
            return request

        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(unary)})])
        if kind == "tls":
            credentials = grpc.ssl_server_credentials(
                [(pki.key("server").read_bytes(), pki.cert("server").read_bytes())],
                root_certificates=pki.cert("ca").read_bytes(), require_client_auth=True)
            ports.put(server.add_secure_port("127.0.0.1:0", credentials))
        else:
            ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def _resources(name: str, port: int, tls: bool) -> List[Any]:
    """Listener `svc-NAME` -> route-NAME (a retry policy on UNAVAILABLE) -> cluster c-NAME (mTLS with `tls`) -> its
    one endpoint 127.0.0.1:`port`."""
    def route(config: Any) -> None:
        config.name = f"route-{name}"
        action = config.virtual_hosts[0].routes[0].route
        action.cluster = f"c-{name}"
        action.retry_policy.CopyFrom(route_components_pb2.RetryPolicy(
            retry_on="unavailable", num_retries=wrappers_pb2.UInt32Value(value=2),
            retry_back_off=route_components_pb2.RetryPolicy.RetryBackOff(
                base_interval=duration_pb2.Duration(nanos=100_000_000), max_interval=duration_pb2.Duration(seconds=1))))

    def secured(message: Any) -> None:
        message.name = f"c-{name}"
        if tls:
            message.transport_socket.CopyFrom(upstream_tls([string_pb2.StringMatcher(exact=SERVER_ID)]))

    def assignment(message: Any) -> None:
        message.cluster_name = f"c-{name}"
        message.endpoints[0].lb_endpoints[0].CopyFrom(lb_endpoint("127.0.0.1", port))

    entry = listener(lambda manager: setattr(manager.rds, "route_config_name", f"route-{name}"))
    entry.name = f"svc-{name}"
    return [entry, route_config(route), cluster(secured), endpoints(assignment)]


def _control_plane(folder: str, tls_port: int, plain_port: int, out: Any, stop: Any) -> None:
    """The ADS server, serving svc-tls and svc-plain; puts the client's bootstrap (one file_watcher provider with
    the `client` certificate) on `out`, then serves until `stop` is set."""
    _exit_with_parent()
    pki = Pki(Path(folder))
    plane = ControlPlane()
    try:
        for resource in _resources("tls", tls_port, True) + _resources("plain", plain_port, False):
            plane.set(resource)
        out.put(plane.bootstrap(NODE, certificate_providers=file_watcher(
            pki.cert("client"), pki.key("client"), pki.cert("ca"))))
        stop.wait()
    finally:
        plane.close()


class Servers:
    """The three server processes (fresh interpreters, spawned: nothing of this process's grpcio state is
    inherited), and the bootstrap that names their control plane."""

    def __init__(self, pki: Pki) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._processes: List[Any] = []
        self._plane: Any = None
        try:
            ports = {}
            for kind in ("tls", "plain"):
                queue = context.Queue()
                self._start(context, _backend, kind, str(pki.folder), queue)
                ports[kind] = queue.get(timeout=60)
            out = context.Queue()
            self._plane = self._start(context, _control_plane, str(pki.folder), ports["tls"], ports["plain"], out,
                                      self._stop)
            self.bootstrap: str = out.get(timeout=60)
        except BaseException:
            self.close()
            raise

    def _start(self, context: Any, target: Callable[..., None], *args: Any) -> Any:
        process = context.Process(target=target, args=args, daemon=True)
        process.start()
        self._processes.append(process)
        return process

    def close(self) -> None:
        """The control plane told to close its server and end, the backends killed; each waited for."""
        self._stop.set()
        for process in self._processes:
            if process is not self._plane:
                process.kill()
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)


# -- the clients -------------------------------------------------------------------------------------------------

# Each client: whose channel (grpcio's or grpc_retry's), to which target, under xDS credentials or insecure ones.
CLIENTS = {"grpcio_tls": ("grpcio", "tls", True), "grpcio_plain": ("grpcio", "plain", False),
           "ours_tls": ("ours", "tls", True), "ours_plain": ("ours", "plain", False),
           "ours_whole_plain": ("ours", "plain", True)}


def _channels(modules: Dict[str, Any]) -> Dict[str, Any]:
    """Every client's channel, made with `modules` ({"grpcio": grpc or grpc.aio, "ours": grpc_retry or
    grpc_retry.aio}). xDS credentials fall back to insecure ones where the cluster asks for no TLS."""
    channels = {}
    for name, (whose, target, xds) in CLIENTS.items():
        module = modules[whose]
        if xds:
            credentials = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
            channels[name] = module.secure_channel(TARGETS[target], credentials, options=OPTIONS)
        else:
            channels[name] = module.insecure_channel(TARGETS[target], options=OPTIONS)
    return channels


def _check(channels: Dict[str, Any]) -> None:
    """grpc_retry's own xDS client serves its insecure channel, grpcio's the others."""
    ours_own = [name for name, channel in channels.items() if getattr(channel, "_router", None) is not None]
    if ours_own != ["ours_plain"]:  # (without the `xds` extra, none: there would be nothing to measure)
        raise RuntimeError(f"grpc_retry's own xDS client serves {ours_own}, where it should serve ours_plain only "
                           "(is the `xds` extra installed?)")


def _sync_runs(channels: Dict[str, Any], calls: int) -> Dict[str, Callable[[], None]]:
    def runner(method: Any) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                method(PAYLOAD)
        return run
    for channel in channels.values():  # the first call waits for the xDS config and the connection
        channel.unary_unary(UNARY)(PAYLOAD, timeout=30, wait_for_ready=True)
    return {name: runner(channel.unary_unary(UNARY)) for name, channel in channels.items()}


def _aio_runs(loop: asyncio.AbstractEventLoop, channels: Dict[str, Any], calls: int) -> Dict[str, Callable[[], None]]:
    def runner(method: Any) -> Callable[[], None]:
        async def run() -> None:
            for _ in range(calls):
                await method(PAYLOAD)
        return lambda: loop.run_until_complete(run())

    async def first(channel: Any) -> None:  # (it waits for the xDS config and the connection)
        await channel.unary_unary(UNARY)(PAYLOAD, timeout=30, wait_for_ready=True)

    for channel in channels.values():
        loop.run_until_complete(first(channel))
    return {name: runner(channel.unary_unary(UNARY)) for name, channel in channels.items()}


def _alternate(runs: Dict[str, Callable[[], None]], calls: int, rounds: int) -> Dict[str, List[float]]:
    """CPU seconds per call of each run, round by round: each run once a round, the order turned by one and
    reversed every other round, so that no client always follows the same one."""
    for run in runs.values():
        run()  # warm up connections and caches
    samples: Dict[str, List[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in (order if r % 2 == 0 else order[::-1]):
            start = time.process_time()
            runs[name]()
            samples[name].append((time.process_time() - start) / calls)
    return samples


def _summary(samples: Dict[str, List[float]]) -> Dict[str, Any]:
    def ratio(over: Callable[[Callable[[str], float]], float]) -> float:
        """The median over the rounds of `over`, given each round's CPU per call by client name."""
        rounds = range(len(samples["ours_tls"]))
        return round(statistics.median(over(lambda name, r=r: samples[name][r]) for r in rounds), 3)

    return {
        "us_per_call": {name: round(statistics.median(samples[name]) * 1e6, 1) for name in CLIENTS},
        "ours_tls_vs_grpcio_tls": ratio(lambda c: c("ours_tls") / c("grpcio_tls")),
        "ours_plain_vs_grpcio_plain": ratio(lambda c: c("ours_plain") / c("grpcio_plain")),
        "grpcio_tls_vs_plain": ratio(lambda c: c("grpcio_tls") / c("grpcio_plain")),
        "ours_tls_vs_plain": ratio(lambda c: c("ours_tls") / c("ours_plain")),
        "quotient": ratio(lambda c: (c("ours_tls") / c("ours_plain")) / (c("grpcio_tls") / c("grpcio_plain"))),
        # the same channel kind as ours_tls (grpcio's, whole), on the plaintext cluster: TLS alone
        "ours_tls_vs_whole_plain": ratio(lambda c: c("ours_tls") / c("ours_whole_plain")),
        "quotient_whole": ratio(lambda c: (c("ours_tls") / c("ours_whole_plain"))
                                / (c("grpcio_tls") / c("grpcio_plain"))),
        "ours_whole_plain_vs_grpcio_plain": ratio(lambda c: c("ours_whole_plain") / c("grpcio_plain")),
    }


def _retry_stats(channels: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """What grpc_retry's channels did under the retry policy (no retries expected)."""
    stats = {}
    for name, channel in channels.items():
        if name.startswith("ours"):
            method = channel.retry_stats().get(UNARY)
            stats[name] = {} if method is None else {
                field: getattr(method, field) for field in ("calls", "attempts", "retries")}
    return stats


def measure_sync(calls: int, rounds: int) -> Dict[str, Any]:
    channels = _channels({"grpcio": grpc, "ours": grpc_retry})
    try:
        _check(channels)
        result = _summary(_alternate(_sync_runs(channels, calls), calls, rounds))
        return {**result, "ours_retry_stats": _retry_stats(channels)}
    finally:
        for channel in channels.values():
            channel.close()


def measure_aio(loop: asyncio.AbstractEventLoop, calls: int, rounds: int) -> Dict[str, Any]:
    async def made() -> Dict[str, Any]:  # (grpc.aio's channels are made in the loop)
        return _channels({"grpcio": grpc.aio, "ours": grpc_retry.aio})

    channels = loop.run_until_complete(made())
    try:
        _check(channels)
        result = _summary(_alternate(_aio_runs(loop, channels, calls), calls, rounds))
        return {**result, "ours_retry_stats": _retry_stats(channels)}
    finally:
        for channel in channels.values():
            loop.run_until_complete(channel.close())


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per round and client (one in flight)")
    parser.add_argument("--rounds", type=int, default=40, help="alternating rounds per API")
    parser.add_argument("--api", default="sync,aio", help="comma-separated: sync, aio")
    args = parser.parse_args(argv)
    apis = [api for api in args.api.split(",") if api]
    result: Dict[str, Any] = {"calls_per_round": args.calls, "rounds": args.rounds, "grpcio": grpc.__version__}
    with tempfile.TemporaryDirectory(prefix="bench-xds-tls-") as folder:
        pki = make_pki(Path(folder))
        servers = Servers(pki)
        try:
            # grpcio reads its bootstrap when its first xDS channel is made, grpc_retry's xDS client when its is.
            os.environ.pop("GRPC_XDS_BOOTSTRAP", None)
            os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = servers.bootstrap
            if "sync" in apis:
                result["sync"] = measure_sync(args.calls, args.rounds)
            if "aio" in apis:
                # (one event loop for the run: grpc.aio before 1.71 cannot move to a second loop)
                loop = asyncio.new_event_loop()
                asyncio.set_event_loop(loop)
                try:
                    result["aio"] = measure_aio(loop, args.calls, args.rounds)
                finally:
                    loop.close()
            from grpc_retry import _transport

            result["transport"] = _transport.NAME
        finally:
            servers.close()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
