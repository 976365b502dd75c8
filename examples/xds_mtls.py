"""Mesh security (gRFC A29) in one program: a CA made on the spot with openssl, two backends that require client
certificates it signed, a minimal xDS control plane in-process whose cluster asks for mutual TLS, and a channel made
with xDS credentials that retries by its service config. Needs the `xds` extra (xds-protos) and openssl on PATH."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import threading
from concurrent import futures
from typing import Any, Dict, Iterator, List, Optional

import grpc
import grpc.experimental
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2, wrappers_pb2

import grpc_retry

SERVER_ID = "spiffe://cluster.local/ns/default/sa/greeter"  # in both backends' certificate
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/client"   # in the client's certificate
SERVICE, METHOD = "demo.Greeter", "/demo.Greeter/SayHello"
PROVIDER = "mesh"  # the bootstrap's certificate provider instance that the cluster names


# -- 1. The certificates: a CA, and the server's and the client's certificates it signs -----------------------------

def certificate(folder: pathlib.Path, name: str, issuer: Optional[str] = None, names: str = "") -> None:
    """NAME.pem and NAME.key in `folder`: an EC P-256 certificate valid for a day, self-signed without `issuer`,
    else signed by ISSUER.pem with subjectAltName `names`."""
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.pem"), "-days", "1",
               "-subj", f"/CN={name}"]
    if issuer is not None:
        command += ["-CA", str(folder / f"{issuer}.pem"), "-CAkey", str(folder / f"{issuer}.key"),
                    "-addext", "basicConstraints=critical,CA:FALSE", "-addext", f"subjectAltName={names}"]
    subprocess.run(command, check=True, capture_output=True)


# -- 2. The backends: TLS only, a client certificate the CA signed required ----------------------------------------

class Backend:
    """A grpcio server on a free loopback port. Its first attempt fails UNAVAILABLE (warming up), for the channel's
    retry policy to retry; then it answers with its name and the client identity TLS gave it."""

    def __init__(self, name: str, pki: pathlib.Path) -> None:
        self.name, self.warmed_up, self._lock = name, False, threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            SERVICE, {"SayHello": grpc.unary_unary_rpc_method_handler(self._say_hello)})])
        credentials = grpc.ssl_server_credentials([((pki / "server.key").read_bytes(),
                                                    (pki / "server.pem").read_bytes())],
                                                  root_certificates=(pki / "ca.pem").read_bytes(),
                                                  require_client_auth=True)
        self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
        self._server.start()

    def _say_hello(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        client = ", ".join(identity.decode() for identity in context.peer_identities() or ())
        previous = str(dict(context.invocation_metadata()).get("grpc-previous-rpc-attempts", "0"))
        with self._lock:
            warming_up, self.warmed_up = not self.warmed_up, True
        if warming_up:
            print(f"  server {self.name}: an attempt from {client} (grpc-previous-rpc-attempts={previous}): "
                  "UNAVAILABLE, warming up")
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return json.dumps({"backend": self.name, "client": client, "previous": previous}).encode()

    def stop(self) -> None:
        self._server.stop(None).wait()


# -- 3. The control plane: an ADS server with one Listener, its Cluster and the Cluster's endpoints ----------------

def packed(message: Any) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def mesh_resources(ports: List[int]) -> List[Any]:
    """Listener "greeter" (its routes inline: everything to "greeter-cluster"), the Cluster (EDS, round robin, mutual
    TLS with PROVIDER's certificate and CA, the server's certificate to name SERVER_ID), and its endpoints."""
    ads = config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource())
    routes = route_pb2.RouteConfiguration(name="greeter-routes", virtual_hosts=[route_components_pb2.VirtualHost(
        name="greeter", domains=["*"], routes=[route_components_pb2.Route(
            match=route_components_pb2.RouteMatch(prefix=""),
            route=route_components_pb2.RouteAction(cluster="greeter-cluster"))])])
    manager = hcm_pb2.HttpConnectionManager(route_config=routes, http_filters=[
        hcm_pb2.HttpFilter(name="router", typed_config=packed(router_pb2.Router()))])
    listener = listener_pb2.Listener(name="greeter",
                                     api_listener=api_listener_pb2.ApiListener(api_listener=packed(manager)))
    provider = common_pb2.CertificateProviderPluginInstance(instance_name=PROVIDER)
    tls = tls_pb2.UpstreamTlsContext(common_tls_context=tls_pb2.CommonTlsContext(
        tls_certificate_provider_instance=provider,  # the client's certificate, presented to the backends
        validation_context=common_pb2.CertificateValidationContext(
            ca_certificate_provider_instance=provider,  # the CA the backends' certificates must chain to
            match_subject_alt_names=[string_pb2.StringMatcher(exact=SERVER_ID)])))
    cluster = cluster_pb2.Cluster(
        name="greeter-cluster", type=cluster_pb2.Cluster.EDS, lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads),
        transport_socket=base_pb2.TransportSocket(name="envoy.transport_sockets.tls", typed_config=packed(tls)))
    endpoints = endpoint_pb2.ClusterLoadAssignment(cluster_name="greeter-cluster", endpoints=[
        endpoint_components_pb2.LocalityLbEndpoints(
            locality=base_pb2.Locality(region="local"), load_balancing_weight=wrappers_pb2.UInt32Value(value=1),
            lb_endpoints=[endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(
                address=address_pb2.Address(socket_address=address_pb2.SocketAddress(
                    address="127.0.0.1", port_value=port)))) for port in ports])])
    return [listener, cluster, endpoints]


class ControlPlane(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]  # (untyped base)
    """ADS, state of the world, resources that never change: a client's first request for a type (no nonce yet)
    gets every resource of that type; its ACKs (and NACKs, printed) of that response need no answer."""

    def __init__(self, resources: List[Any]) -> None:
        self._by_type: Dict[str, List[any_pb2.Any]] = {}
        for resource in map(packed, resources):
            self._by_type.setdefault(resource.type_url, []).append(resource)
        self._streams, self._ended = 0, threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def StreamAggregatedResources(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        with self._ended:
            self._streams += 1
        context.add_callback(self._end)
        for request in requests:
            if request.error_detail.message:
                print(f"  control plane: NACK of {request.type_url}: {request.error_detail.message}")
            elif not request.response_nonce:
                yield discovery_pb2.DiscoveryResponse(version_info="1", type_url=request.type_url, nonce="1",
                                                      resources=self._by_type.get(request.type_url, []))

    def _end(self) -> None:
        with self._ended:
            self._streams -= 1
            self._ended.notify_all()

    def stop(self) -> None:
        """Once the clients' streams have ended (a client ends its stream when its last xDS channel closes): a
        stream cut by the server's stop would have grpcio log the GOAWAY it got."""
        with self._ended:
            self._ended.wait_for(lambda: self._streams == 0, timeout=5)
        self._server.stop(None).wait()


# -- Putting it together --------------------------------------------------------------------------------------------

with tempfile.TemporaryDirectory() as folder:
    pki = pathlib.Path(folder)
    certificate(pki, "ca")
    certificate(pki, "server", "ca", f"URI:{SERVER_ID},DNS:localhost,IP:127.0.0.1")
    certificate(pki, "client", "ca", f"URI:{CLIENT_ID}")
    print(f"pki: a CA, the server's certificate ({SERVER_ID}) and the client's ({CLIENT_ID}), in {folder}")

    backends = [Backend("greeter-a", pki), Backend("greeter-b", pki)]
    print("backends:", ", ".join(f"{b.name} on 127.0.0.1:{b.port}" for b in backends), "(client certificates required)")
    plane = ControlPlane(mesh_resources([backend.port for backend in backends]))
    print(f"control plane: ADS on 127.0.0.1:{plane.port}, Listener greeter -> Cluster greeter-cluster (mTLS)")

    # 4. The bootstrap, before any xDS channel is made: where the control plane is, and the certificate provider
    # that the cluster's TLS names (a file_watcher: the files are read again every refresh_interval).
    os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps({
        "xds_servers": [{"server_uri": f"127.0.0.1:{plane.port}", "channel_creds": [{"type": "insecure"}]}],
        "node": {"id": "xds-mtls-example"},
        "certificate_providers": {PROVIDER: {"plugin_name": "file_watcher", "config": {
            "certificate_file": str(pki / "client.pem"), "private_key_file": str(pki / "client.key"),
            "ca_certificate_file": str(pki / "ca.pem"), "refresh_interval": "60s"}}}})

    # 5. The channel: xDS credentials let the clusters' TLS apply (plaintext, the fallback, where a cluster asks for
    # none); grpc_retry retries by the service config.
    config = json.dumps({"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.05s", "backoffMultiplier": 1,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]})
    fallback = grpc.experimental.insecure_channel_credentials()  # type: ignore[no-untyped-call]  # (untyped stub)
    credentials = grpc.xds_channel_credentials(fallback)
    with grpc_retry.secure_channel("xds:///greeter", credentials,
                                   options=[("grpc.service_config", config)]) as channel:
        say_hello = channel.unary_unary(METHOD)
        for n in range(1, 7):
            reply = json.loads(say_hello(b"hello", timeout=10))
            # The client saw the server as SERVER_ID: the cluster's SAN matcher let no other certificate through.
            print(f"client: call {n}: {reply['backend']} answered (attempt {int(reply['previous']) + 1}); "
                  f"the client saw the server as {SERVER_ID}, the server saw the client as {reply['client']}")
            assert reply["client"] == CLIENT_ID
        print("client: retry statistics:")
        print(channel.retry_stats())
        assert channel.retry_stats()[METHOD].retries == sum(b.warmed_up for b in backends)
    plane.stop()
    for backend in backends:
        backend.stop()
