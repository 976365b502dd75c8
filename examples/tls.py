"""TLS with secure_channel: a self-signed certificate for "localhost" (made with openssl), a retried call over it.
Subchannels dial the resolved address and verify the certificate against the target's name."""

import json
import pathlib
import subprocess
import tempfile

import grpc
from _server import CALL, Server

import grpc_retry

with tempfile.TemporaryDirectory() as folder:
    key, cert = pathlib.Path(folder, "key.pem"), pathlib.Path(folder, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    server = Server(fail_first=1, credentials=grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
    config = json.dumps({"methodConfig": [{"name": [{"service": "demo.Echo"}], "retryPolicy": {
        "maxAttempts": 2, "initialBackoff": "0.05s", "maxBackoff": "0.05s", "backoffMultiplier": 1,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]})
    credentials = grpc.ssl_channel_credentials(cert.read_bytes())
    with grpc_retry.secure_channel(f"localhost:{server.port}", credentials,
                                   options=[("grpc.service_config", config)]) as channel:
        print("client:", channel.unary_unary(CALL)(b"over TLS", timeout=5))
    assert len(server.attempts) == 2
    server.stop()
