"""What the process was told by its xDS servers (`grpc_retry.xds_status()`), and `python -m grpc_retry xds-status`,
which follows targets from the environment's bootstrap and prints every resource they need, as it stands."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Sequence


@dataclass(frozen=True)
class XdsResource:
    """One resource the process holds: the server it came from, its type and name, its status ("requested",
    "acked", "nacked", "does not exist"), the version of the value held, why the last update was rejected, when it
    last changed (seconds since the epoch), and for a Cluster whose value is held, the TLS its transport socket asks
    for (gRFC A29: "plaintext", or e.g. "identity mesh, ca mesh, SANs exact spiffe://…"; "" otherwise), the
    load-balancing policy it asks for (e.g. "ring_hash") and the one that serves it ("round_robin" where grpc_retry
    has not the one asked for; ring_hash with its ring's sizes), and the retry budget in force for its calls (its
    circuit breaker's `retry_budget` and `max_retries`; "" for none); for a RouteConfiguration, the hash policies
    of its routes that have any (gRFC A42: what a ring_hash cluster's calls hash); for a Cluster whose lrs_server is
    the management server, its load reports (whether the stream is open, reports sent)."""

    server: str
    type: str
    name: str
    status: str
    version: str
    error: str
    updated: float
    tls: str = ""
    lb_policy: str = ""
    lb_policy_in_force: str = ""
    retry_budget: str = ""
    hash_policies: str = ""
    load_reports: str = ""


def xds_status() -> List[XdsResource]:
    """Every xDS resource the process's channels hold, by server, type and name."""
    client_module = sys.modules.get("grpc_retry._backends.xds.client")
    if client_module is None:  # no xDS client was ever made (or the xds extra is not installed)
        return []
    with client_module.XdsClient._clients_lock:
        clients = list(client_module.XdsClient._clients.values())
    return sorted((XdsResource(**entry) for client in clients for entry in client.snapshot()),
                  key=lambda r: (r.server, r.type, r.name))


def main(targets: Sequence[str], wait: float, as_json: bool) -> int:
    """Follow `targets` (xds: URIs) for at most `wait` seconds, or until each has a whole config or an error;
    print every resource. Exit status: 0 all acked, 1 any resource not (or a target in error), 2 bad input."""
    from urllib.parse import urlsplit

    try:
        from grpc_retry._backends.xds.bootstrap import BootstrapError, load
        bootstrap = load()
        from grpc_retry._backends.xds.client import XdsClient
        from grpc_retry._backends.xds.config import ConfigWatcher
    except (BootstrapError, ImportError) as error:
        print(f"xds-status: {error}", file=sys.stderr)
        return 2
    done = threading.Condition()
    outcome: dict[str, str] = {}
    followed = []
    clients = []
    for target in targets:
        parts = urlsplit(target)
        if parts.scheme != "xds":
            print(f"xds-status: {target!r} is not an xds: target", file=sys.stderr)
            return 2
        name = parts.path.lstrip("/")
        try:
            listener = bootstrap.listener_name(parts.netloc, name)
        except ValueError as error:
            print(f"xds-status: {error}", file=sys.stderr)
            return 2
        client = XdsClient.acquire(bootstrap.servers(parts.netloc or None)[0], bootstrap.node,
                                   bootstrap.certificate_providers)
        clients.append(client)

        followed.append(ConfigWatcher(client, listener, name, _Told(target, outcome, done).config,
                                      _Told(target, outcome, done).error))
    with done:
        done.wait_for(lambda: len(outcome) == len(targets), wait)
    resources = xds_status()
    for watcher in followed:
        watcher.close()
    for client in clients:
        client.release()
    errors = {t: outcome.get(t, "no whole config yet") for t in targets if outcome.get(t) != "ok"}
    if as_json:
        print(json.dumps({"resources": [asdict(r) for r in resources], "targets": {
            t: outcome.get(t, "no whole config yet") for t in targets}}, indent=2))
    else:
        _print(resources, errors)
    bad = errors or any(r.status != "acked" for r in resources)
    return 1 if bad else 0


def _print(resources: List[XdsResource], errors: dict[str, str]) -> None:
    rows = [("TYPE", "NAME", "STATUS", "VERSION", "UPDATED", "ERROR")]
    for r in resources:
        updated = time.strftime("%H:%M:%S", time.localtime(r.updated)) if r.updated else ""
        rows.append((r.type, r.name, r.status, r.version, updated, r.error))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    servers = sorted({r.server for r in resources})
    if servers:
        print(f"xDS server{'s' if len(servers) > 1 else ''}: {', '.join(servers)}")
    under = " " * (widths[0] + 2)
    for row, resource in zip(rows, [None, *resources], strict=True):
        print(("  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)) + "  " + row[5])
              .rstrip())
        if resource is None:
            continue
        # (a cluster's TLS and LB policy, each on a line of its own under its name)
        if resource.tls:
            print(f"{under}tls: {resource.tls}")
        if resource.lb_policy:
            served = resource.lb_policy_in_force
            print(f"{under}lb_policy: {resource.lb_policy}" + (
                f" (not implemented: {served} serves it)" if served.split(" (")[0] != resource.lb_policy
                else served[len(resource.lb_policy):]))
        if resource.load_reports:
            print(f"{under}load reports: {resource.load_reports}")
        if resource.hash_policies:
            print(f"{under}hash policies: {resource.hash_policies}")
        if resource.retry_budget:
            print(f"{under}retry budget: {resource.retry_budget}")
    for target, error in errors.items():
        print(f"{target}: {error}")


class _Told:
    """What one target's ConfigWatcher says: "ok" for a whole config, else the error."""

    def __init__(self, target: str, outcome: Dict[str, str], done: threading.Condition) -> None:
        self._target, self._outcome, self._done = target, outcome, done

    def config(self, _: Any) -> None:
        self.error("ok")

    def error(self, message: str) -> None:
        with self._done:
            self._outcome[self._target] = message
            self._done.notify_all()
