"""A target followed from its Listener to its endpoints (ConfigWatcher) on a real control plane: what it
subscribes to follows what the resources name, and what stops a whole config is told as an error."""

from __future__ import annotations

import threading
from typing import Any, Iterator, List

import pytest

pytest.importorskip("envoy")

from envoy.config.cluster.v3 import cluster_pb2  # noqa: E402
from envoy.config.core.v3 import address_pb2  # noqa: E402
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2  # noqa: E402
from support.control_plane import ENDPOINTS, ControlPlane  # noqa: E402
from support.xds_resources import cluster, endpoints, listener, route_config  # noqa: E402

from grpc_retry._backends.xds.bootstrap import parse  # noqa: E402
from grpc_retry._backends.xds.client import XdsClient  # noqa: E402
from grpc_retry._backends.xds.config import ConfigWatcher, XdsConfig  # noqa: E402


class Told:
    def __init__(self) -> None:
        self.configs: List[XdsConfig] = []
        self.errors: List[str] = []
        self._changed = threading.Condition()

    def config(self, config: XdsConfig) -> None:
        with self._changed:
            self.configs.append(config)
            self._changed.notify_all()

    def error(self, message: str) -> None:
        with self._changed:
            self.errors.append(message)
            self._changed.notify_all()

    def wait(self, predicate: Any, timeout: float = 10.0) -> None:
        with self._changed:
            assert self._changed.wait_for(predicate, timeout), (self.configs, self.errors)


@pytest.fixture
def plane() -> Iterator[ControlPlane]:
    control_plane = ControlPlane()
    yield control_plane
    control_plane.close()


@pytest.fixture
def follow(plane: ControlPlane) -> Iterator[Any]:
    made: List[Any] = []

    def start(authority: str = "svc", timeout: float = 15.0) -> Told:
        bootstrap = parse(plane.bootstrap("n"))
        client = XdsClient(bootstrap.xds_servers[0], bootstrap.node, timeout=timeout)
        told = Told()
        made.append((client, ConfigWatcher(client, "svc", authority, told.config, told.error)))
        return told
    yield start
    for client, watcher in made:
        watcher.close()
        client.close()


def test_what_it_watches_follows_the_routes(plane: ControlPlane, follow: Any) -> None:
    for resource in (listener(), route_config(), cluster(), endpoints()):
        plane.set(resource)
    told = follow()
    told.wait(lambda: len(told.configs) >= 1)
    assert set(told.configs[-1].clusters) == {"c1"}
    plane.set(cluster(lambda c: setattr(c, "name", "c2")))
    plane.set(endpoints(lambda e: setattr(e, "cluster_name", "c2")))
    plane.set(route_config(lambda r: setattr(r.virtual_hosts[0].routes[0].route, "cluster", "c2")))
    told.wait(lambda: set(told.configs[-1].clusters) == {"c2"})
    assert set(told.configs[-1].endpoints) == {"c2"}
    plane.wait_for(lambda: any(r.node == "n" and r.type_url == ENDPOINTS and r.names == ("c2",)
                               for r in plane.requests), what="c1's endpoints given up for c2's")


def test_an_inline_route_configuration_needs_no_rds(plane: ControlPlane, follow: Any) -> None:
    def inline(manager: Any) -> None:
        manager.ClearField("rds")
        manager.route_config.CopyFrom(route_config())
    plane.set(listener(inline))
    plane.set(cluster())
    plane.set(endpoints())
    told = follow()
    told.wait(lambda: len(told.configs) >= 1)
    assert told.configs[-1].listener.route_config_name is None and told.configs[-1].route_config.name == "route-1"


def test_a_logical_dns_cluster_has_no_endpoints_to_wait_for(plane: ControlPlane, follow: Any) -> None:
    dns = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.LOGICAL_DNS, load_assignment=(
        endpoint_pb2.ClusterLoadAssignment(endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[
            endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(address="backend.example", port_value=443))))])])))
    for resource in (listener(), route_config(), dns):
        plane.set(resource)
    told = follow()
    told.wait(lambda: len(told.configs) >= 1)
    config = told.configs[-1]
    assert config.clusters["c1"].dns_target == "backend.example:443" and config.endpoints == {"c1": None}


def test_a_missing_listener_and_a_name_no_virtual_host_takes_are_errors(plane: ControlPlane, follow: Any) -> None:
    told = follow(timeout=0.3)
    told.wait(lambda: any("LDS resource svc: does not exist" in e for e in told.errors))
    plane.set(listener())
    plane.set(route_config(lambda r: r.virtual_hosts[0].domains.__setitem__(0, "other.example")))
    told.wait(lambda: any("no virtual host" in e for e in told.errors))
    assert not told.configs
