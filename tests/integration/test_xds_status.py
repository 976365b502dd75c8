"""`python -m grpc_retry xds-status` follows a target from the environment's bootstrap and prints every resource
with its status; `grpc_retry.xds_status()` is what the process holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, Tuple

import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import cluster_pb2  # noqa: E402
from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (  # noqa: E402
    client_side_weighted_round_robin_pb2 as wrr_pb2,
)
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2  # noqa: E402
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2  # noqa: E402
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2  # noqa: E402
from envoy.type.matcher.v3 import string_pb2  # noqa: E402
from support.control_plane import LISTENER, ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, listener, packed, route_config  # noqa: E402

import grpc_retry  # noqa: E402
from grpc_retry._backends.xds import resources  # noqa: E402
from grpc_retry._backends.xds.bootstrap import parse  # noqa: E402
from grpc_retry._backends.xds.client import Watcher, XdsClient  # noqa: E402

_AWAY = tempfile.mkdtemp(prefix="grpc_retry-xds-status-")  # an empty directory to run the command in


@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    for resource in (listener(), route_config(), cluster(), endpoints()):
        control_plane.set(resource)
    yield control_plane
    control_plane.close()


def status(env: Dict[str, str], *args: str) -> Tuple[int, Any, str]:
    """The command's exit status, output and errors (run away from the source tree, which would shadow the
    installed, compiled package)."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_XDS_BOOTSTRAP")}
    run_env.update(env)
    done = subprocess.run([sys.executable, "-m", "grpc_retry", "xds-status", *args], capture_output=True, text=True,
                          env=run_env, timeout=60, cwd=_AWAY)
    return done.returncode, done.stdout, done.stderr


def test_every_resource_of_a_target_and_its_status(plane: ControlPlane) -> None:
    code, out, _ = status({"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli")}, "xds:///svc", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["targets"] == {"xds:///svc": "ok"}
    assert {(r["type"], r["name"], r["status"], r["version"]) for r in report["resources"]} == {
        ("Listener", "svc", "acked", "1"), ("RouteConfiguration", "route-1", "acked", "1"),
        ("Cluster", "c1", "acked", "1"), ("ClusterLoadAssignment", "c1", "acked", "1")}
    code, out, _ = status({"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli")}, "xds:///svc")
    assert code == 0 and "ClusterLoadAssignment" in out and "acked" in out


def test_a_rejected_resource_is_shown_with_its_error(plane: ControlPlane) -> None:
    plane.set(cluster(lambda c: setattr(c, "lb_policy", cluster_pb2.Cluster.LEAST_REQUEST)))
    code, out, _ = status({"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli")}, "xds:///svc", "--json",
                          "--wait", "2")
    assert code == 1
    (rejected,) = [r for r in json.loads(out)["resources"] if r["type"] == "Cluster"]
    assert rejected["status"] == "nacked" and "lb_policy: LB policy is not supported" in rejected["error"]


def test_each_clusters_tls_is_shown(plane: ControlPlane) -> None:
    """The TLS a cluster's transport socket asks for (gRFC A29): its certificate providers and SAN matchers, or
    plaintext; a line under the cluster's row, and `tls` in --json."""
    providers = {"mesh": {"plugin_name": "file_watcher", "config": {"certificate_file": "/c.pem",
                                                                    "private_key_file": "/k.pem",
                                                                    "ca_certificate_file": "/ca.pem"}}}
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli", certificate_providers=providers)}
    code, out, _ = status(env, "xds:///svc", "--json")
    assert code == 0
    assert {r["type"]: r["tls"] for r in json.loads(out)["resources"]} == {
        "Listener": "", "RouteConfiguration": "", "Cluster": "plaintext", "ClusterLoadAssignment": ""}
    mesh = common_pb2.CertificateProviderPluginInstance(instance_name="mesh")
    context = tls_pb2.UpstreamTlsContext(common_tls_context=tls_pb2.CommonTlsContext(
        tls_certificate_provider_instance=mesh, validation_context=common_pb2.CertificateValidationContext(
            ca_certificate_provider_instance=mesh, match_subject_alt_names=[
                string_pb2.StringMatcher(exact="spiffe://cluster.local/ns/default/sa/backend")])))
    plane.set(cluster(lambda c: c.transport_socket.CopyFrom(base_pb2.TransportSocket(
        name="envoy.transport_sockets.tls", typed_config=packed(context)))))
    code, out, _ = status(env, "xds:///svc")
    assert code == 0
    lines = out.splitlines()
    (row,) = [i for i, line in enumerate(lines) if line.startswith("Cluster ")]
    assert lines[row + 1] == " " * len("ClusterLoadAssignment  ") + \
        "tls: identity mesh, ca mesh, SANs exact spiffe://cluster.local/ns/default/sa/backend"
    assert sum("tls:" in line for line in lines) == 1


def test_each_clusters_lb_policy_is_shown_with_the_one_in_force(plane: ControlPlane) -> None:
    """The LB policy a cluster asks for and the one that serves it: round_robin as asked; ring_hash as asked, with
    its ring's sizes; weighted_round_robin, which grpc_retry has not, served by round_robin, said on its line;
    wrr_locality over round_robin as asked."""
    env = {"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli")}

    def shown() -> Tuple[Tuple[str, str], str]:
        code, out, _ = status(env, "xds:///svc", "--json")
        assert code == 0
        (held,) = [r for r in json.loads(out)["resources"] if r["type"] == "Cluster"]
        code, text, _ = status(env, "xds:///svc")
        assert code == 0
        (line,) = [line.strip() for line in text.splitlines() if "lb_policy:" in line]
        return (held["lb_policy"], held["lb_policy_in_force"]), line

    assert shown() == (("round_robin", "round_robin"), "lb_policy: round_robin")
    plane.set(cluster(lambda c: setattr(c, "lb_policy", cluster_pb2.Cluster.RING_HASH)))
    assert shown() == (("ring_hash", "ring_hash (ring of 1024 to 4096 entries)"),
                       "lb_policy: ring_hash (ring of 1024 to 4096 entries)")
    plane.set(cluster(lambda c: c.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(
        wrr_pb2.ClientSideWeightedRoundRobin())))
    assert shown() == (("weighted_round_robin", "round_robin"),
                       "lb_policy: weighted_round_robin (not implemented: round_robin serves it)")
    wrapper = wrr_locality_pb2.WrrLocality()
    wrapper.endpoint_picking_policy.policies.add().typed_extension_config.typed_config.Pack(
        round_robin_pb2.RoundRobin())
    plane.set(cluster(lambda c: c.load_balancing_policy.policies.add().typed_extension_config.typed_config.Pack(
        wrapper)))
    assert shown() == (("wrr_locality(round_robin)", "wrr_locality(round_robin)"),
                       "lb_policy: wrr_locality(round_robin)")


def test_bad_input_exits_2(plane: ControlPlane, tmp_path: Any) -> None:
    code, _, err = status({}, "xds:///svc")
    assert code == 2 and "neither GRPC_XDS_BOOTSTRAP" in err
    code, _, err = status({"GRPC_XDS_BOOTSTRAP_CONFIG": "{}"}, "xds:///svc")
    assert code == 2 and "xds_servers: is required" in err
    code, _, err = status({"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli")}, "dns:///svc")
    assert code == 2 and "not an xds: target" in err
    code, _, err = status({"GRPC_XDS_BOOTSTRAP_CONFIG": plane.bootstrap("cli")}, "xds://nowhere/svc")
    assert code == 2 and "no authority 'nowhere'" in err


def test_the_function_shows_what_the_process_holds(plane: ControlPlane) -> None:
    done = subprocess.run([sys.executable, "-c", "import grpc_retry; print(grpc_retry.xds_status())"],
                          capture_output=True, text=True, timeout=60, cwd=_AWAY)
    assert done.stdout.strip() == "[]"  # no xDS client made: nothing held, no envoy protos imported
    bootstrap = parse(plane.bootstrap("in-process"))
    client = XdsClient.acquire(bootstrap.xds_servers[0], bootstrap.node)
    watcher = Watcher()
    try:
        client.watch(resources.LISTENER, "svc", watcher)
        plane.wait_answer("in-process", LISTENER, 1)
        (held,) = [r for r in grpc_retry.xds_status() if r.server == plane.target]
        assert (held.type, held.name, held.status, held.version, held.error) == ("Listener", "svc", "acked", "1", "")
        assert held.updated > 0
    finally:
        client.unwatch(resources.LISTENER, "svc", watcher)
        client.release()
    assert not [r for r in grpc_retry.xds_status() if r.server == plane.target]
