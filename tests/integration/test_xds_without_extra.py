"""Without the `xds` extra, an `xds:` target goes whole to one grpcio channel, whose own xDS client serves it (README,
"Main differences"; docs/guide/xds.md): proved in a process whose environment is this one's with `xds-protos` never
installed, against a real control plane (tests/support/control_plane.py) and real backends on loopback."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

pytest.importorskip("envoy")  # (the control plane, in this process, is built on the extra)

from envoy.config.route.v3 import route_components_pb2  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402
from support.backend import UNARY, Backend, Step, fail  # noqa: E402
from support.control_plane import LISTENER, ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, lb_endpoint, listener, route_config  # noqa: E402

EXTRA = "xds-protos"


def _name(distribution: importlib.metadata.Distribution) -> str:
    return re.sub(r"[-_.]+", "-", distribution.metadata["Name"]).lower()


def site_without_extra(into: Path) -> Path:
    """This environment's site-packages as it is with `xds-protos` never installed, as symlinks in `into`: each
    top-level entry the extra has no file in, whole; in those it shares (google/, opentelemetry/), each file another
    distribution installed there (a file two install, e.g. google/rpc/status_pb2.py, stays: it is the other's
    too). The .pth files come along, so an editable install of grpc_retry is found as a wheel install is."""
    extra = importlib.metadata.distribution(EXTRA)
    site_dir = Path(str(extra.locate_file(""))).resolve()
    shared = {file.parts[0] for file in extra.files or () if file.parts[0] != ".."}
    into.mkdir()
    for entry in site_dir.iterdir():
        if entry.name not in shared:
            (into / entry.name).symlink_to(entry)
    for distribution in importlib.metadata.distributions(path=[str(site_dir)]):
        if _name(distribution) == EXTRA:
            continue
        for file in distribution.files or ():
            source = site_dir / file
            if file.parts[0] in shared and source.is_file():
                (into / file).parent.mkdir(parents=True, exist_ok=True)
                if not (into / file).exists():
                    (into / file).symlink_to(source)
    return into


# Run as `python -I -S`: sys.path is the standard library and, once added here, the envoy-less site-packages.
_CLIENT = r"""
import asyncio, importlib.metadata, json, logging, site, sys

site.addsitedir(sys.argv[1])
try:
    import envoy  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit(f"the envoy protos are importable: {envoy.__path__}")
try:
    importlib.metadata.distribution("xds-protos")
except importlib.metadata.PackageNotFoundError:
    pass
else:
    raise SystemExit("xds-protos is installed")

import grpc
import grpc.experimental
import grpc_retry
import grpc_retry.aio

TARGET, METHOD, CALLS = "xds:///svc", sys.argv[2], int(sys.argv[3])
CREDENTIALS = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
notices = []


class Notices(logging.Handler):
    def emit(self, record):
        if "xds extra" in record.getMessage():
            notices.append([record.levelname, record.getMessage()])


log = logging.getLogger("grpc_retry")
log.addHandler(Notices())
log.setLevel(logging.DEBUG)


def shape(channel):
    # Which channel it is, and what its backends are: one grpcio channel given the whole target, or grpc_retry's
    # own xDS client's clusters.
    target = channel._subchannels.target
    return [f"{type(channel).__module__}.{type(channel).__qualname__}", target.scheme, list(target.addresses)]


def sync_calls(channel):
    with channel:
        method = channel.unary_unary(METHOD)
        for _ in range(CALLS):
            assert method(b"x", timeout=30, wait_for_ready=True) == b"x"
        return shape(channel)


async def aio_calls():
    shapes = []
    for make in (lambda: grpc_retry.aio.insecure_channel(TARGET),
                 lambda: grpc_retry.aio.secure_channel(TARGET, CREDENTIALS)):
        async with make() as channel:
            method = channel.unary_unary(METHOD)
            for _ in range(CALLS):
                assert await method(b"x", timeout=30, wait_for_ready=True) == b"x"
            shapes.append(shape(channel))
    return shapes


channels = {"sync insecure": sync_calls(grpc_retry.insecure_channel(TARGET)),
            "sync secure": sync_calls(grpc_retry.secure_channel(TARGET, CREDENTIALS))}
channels["aio insecure"], channels["aio secure"] = asyncio.run(aio_calls())
print(json.dumps({
    "channels": channels,
    "protos": sorted(m for m in sys.modules if m.split(".")[0] in ("envoy", "xds", "udpa", "validate")),
    "xds_modules": sorted(m for m in sys.modules if m.startswith("grpc_retry._backends.xds.")),
    "notices": notices,
}))
"""

CALLS = 3  # per channel
KINDS = ("sync insecure", "sync secure", "aio insecure", "aio secure")


def test_xds_target_goes_whole_to_grpcios_xds_client_without_the_extra(tmp_path: Path,
                                                                         backends: List[Backend]) -> None:
    named = backends[1]  # the only backend the control plane names
    # The route retries UNAVAILABLE once (A44), which only grpcio's xDS client can know here, and C-core's retries
    # stay on in a channel with no policy of grpc_retry's: every first attempt fails, its retry succeeds.
    named.fallback(UNARY, lambda i: fail() if i % 2 == 0 else Step())
    retries = route_components_pb2.RetryPolicy(retry_on="unavailable", num_retries=wrappers_pb2.UInt32Value(value=1))

    def one_backend(message: Any) -> None:
        del message.endpoints[0].lb_endpoints[:]
        message.endpoints[0].lb_endpoints.append(lb_endpoint("127.0.0.1", named.port))

    plane = ControlPlane()
    try:
        plane.set(listener())
        plane.set(route_config(lambda config: config.virtual_hosts[0].routes[0].route.retry_policy.CopyFrom(retries)))
        plane.set(cluster())
        plane.set(endpoints(one_backend))
        bootstrap = tmp_path / "bootstrap.json"
        bootstrap.write_text(plane.bootstrap("no-extra"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_XDS")}
        env["GRPC_XDS_BOOTSTRAP"] = str(bootstrap)
        site = site_without_extra(tmp_path / "site-packages")
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _CLIENT, str(site), UNARY, str(CALLS)],
                              capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert plane.answers("no-extra", LISTENER), "the process's xDS client never asked the control plane"
    finally:
        plane.close()
    report = json.loads(done.stdout)
    # Each API's channel, not routed: one grpcio channel given the whole target.
    assert report["channels"] == {kind: [f"grpc_retry.{kind.split()[0]}._channel.Channel", "whole", ["xds:///svc"]]
                                  for kind in KINDS}
    attempts = named.attempts_of(UNARY)
    assert [a.previous for a in attempts] == [None, "1"] * (len(KINDS) * CALLS)
    assert not backends[0].attempts and not backends[2].attempts
    assert report["protos"] == []
    # (Of grpc_retry's xDS client, only the modules that need no protos: the client, its resources, the router not.)
    assert set(report["xds_modules"]) <= {f"grpc_retry._backends.xds.{name}"
                                          for name in ("bootstrap", "certificates", "errors", "status")}
    assert [level for level, _ in report["notices"]] == ["DEBUG"]
