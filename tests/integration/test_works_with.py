"""Libraries gRPC users combine with grpcio, through grpcio's channel and grpc_retry's side by side: grpcio-status's
rich errors (`rpc_status.from_call`, sync and asyncio) and google-api-core's error mapping and Retry around a
stub method (`grpc_helpers.wrap_errors`, `retry.Retry`)."""

from __future__ import annotations

import asyncio
from concurrent import futures
from typing import Any, Callable, List

import grpc
import grpc.aio
import pytest
from google.api_core import exceptions, grpc_helpers
from google.api_core import retry as api_retry
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

import grpc_retry
import grpc_retry.aio

SERVICE = "grpc_retry.test.Rich"


def rich_status() -> status_pb2.Status:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason="STOCK_OUT", domain="shop.example", metadata={"sku": "42"}))
    return status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message="out of stock", details=[detail])


@pytest.fixture(scope="module")
def server():
    calls: List[int] = []

    def fails(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort_with_status(rpc_status.to_status(rich_status()))

    def flaky(request: bytes, context: grpc.ServicerContext) -> bytes:
        calls.append(1)
        if len(calls) % 3:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return request

    s = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    s.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
        "Fails": grpc.unary_unary_rpc_method_handler(fails),
        "Flaky": grpc.unary_unary_rpc_method_handler(flaky)})])
    port = s.add_insecure_port("127.0.0.1:0")
    s.start()
    yield f"127.0.0.1:{port}"
    s.stop(None)


MAKERS = [pytest.param(grpc.insecure_channel, id="grpcio"), pytest.param(grpc_retry.insecure_channel, id="ours")]
AIO_MAKERS = [pytest.param(grpc.aio.insecure_channel, id="grpcio"),
              pytest.param(grpc_retry.aio.insecure_channel, id="ours")]


@pytest.mark.parametrize("make", MAKERS)
def test_grpcio_status_reads_rich_errors(server: str, make: Callable[..., Any]):
    with make(server) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(f"/{SERVICE}/Fails")(b"x", timeout=5)
    status = rpc_status.from_call(raised.value)
    assert status == rich_status()
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info) and info.reason == "STOCK_OUT"


@pytest.mark.parametrize("make", AIO_MAKERS)
def test_grpcio_status_reads_rich_errors_on_asyncio(server: str, make: Callable[..., Any]):
    async def main() -> status_pb2.Status:
        async with make(server) as channel:
            call = channel.unary_unary(f"/{SERVICE}/Fails")(b"x", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError):
                await call
            return await rpc_status.aio.from_call(call)

    assert asyncio.run(main()) == rich_status()


@pytest.mark.parametrize("make", MAKERS)
def test_google_api_core_maps_errors_and_retries(server: str, make: Callable[..., Any]):
    with make(server) as channel:
        fails = grpc_helpers.wrap_errors(channel.unary_unary(f"/{SERVICE}/Fails"))
        with pytest.raises(exceptions.FailedPrecondition) as raised:
            fails(b"x", timeout=5)
        assert raised.value.message == "out of stock"
        assert raised.value.reason == "STOCK_OUT" and raised.value.metadata == {"sku": "42"}
        flaky = grpc_helpers.wrap_errors(channel.unary_unary(f"/{SERVICE}/Flaky"))
        retrying = api_retry.Retry(predicate=api_retry.if_exception_type(exceptions.ServiceUnavailable),
                                   initial=0.01, maximum=0.05, timeout=10)
        assert retrying(flaky)(b"again", timeout=5) == b"again"
