"""Builders of xDS resources for tests: a whole chain (Listener "svc" -> RouteConfiguration "route-1" -> Cluster
"c1" -> its ClusterLoadAssignment), each with a hook to change it."""

from __future__ import annotations

from typing import Any, Callable

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2, wrappers_pb2

ADS = config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource())


def packed(message: Any) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def http_filter(name: str, config: Any, optional: bool = False) -> hcm_pb2.HttpFilter:
    return hcm_pb2.HttpFilter(name=name, typed_config=packed(config), is_optional=optional)


def listener(edit: Callable[[hcm_pb2.HttpConnectionManager], Any] = lambda m: None, api: bool = True) -> Any:
    manager = hcm_pb2.HttpConnectionManager(rds=hcm_pb2.Rds(route_config_name="route-1", config_source=ADS),
                                            http_filters=[http_filter("router", router_pb2.Router())])
    edit(manager)
    message = listener_pb2.Listener(name="svc")
    if api:
        message.api_listener.CopyFrom(api_listener_pb2.ApiListener(api_listener=packed(manager)))
    return message


def route_config(edit: Callable[[route_pb2.RouteConfiguration], Any] = lambda r: None) -> Any:
    config = route_pb2.RouteConfiguration(name="route-1", virtual_hosts=[route_components_pb2.VirtualHost(
        name="vh", domains=["*"], routes=[route_components_pb2.Route(
            match=route_components_pb2.RouteMatch(prefix=""),
            route=route_components_pb2.RouteAction(cluster="c1"))])])
    edit(config)
    return config


def cluster(edit: Callable[[cluster_pb2.Cluster], Any] = lambda c: None) -> Any:
    message = cluster_pb2.Cluster(name="c1", type=cluster_pb2.Cluster.EDS,
                                  eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ADS))
    edit(message)
    return message


def lb_endpoint(address: str, port: int = 50051, **fields: Any) -> endpoint_components_pb2.LbEndpoint:
    return endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(
        address=address_pb2.Address(socket_address=address_pb2.SocketAddress(address=address, port_value=port))),
        **fields)


def endpoints(edit: Callable[[endpoint_pb2.ClusterLoadAssignment], Any] = lambda e: None) -> Any:
    message = endpoint_pb2.ClusterLoadAssignment(cluster_name="c1", endpoints=[
        endpoint_components_pb2.LocalityLbEndpoints(
            locality=base_pb2.Locality(region="r", zone="z"), load_balancing_weight=wrappers_pb2.UInt32Value(value=1),
            lb_endpoints=[lb_endpoint("127.0.0.1")])])
    edit(message)
    return message
