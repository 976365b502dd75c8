"""grpcio's abstract classes that grpc_retry's channels, multicallables and calls subclass. grpc's type stubs
(types-grpcio) make them generic in request and response; grpcio's classes are not, and cannot be subscripted at
run time. Here they are both: subscripted for the type checker, plain at run time."""

from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

if TYPE_CHECKING:
    UnaryUnaryMultiCallable = grpc.UnaryUnaryMultiCallable[Any, Any]
    UnaryStreamMultiCallable = grpc.UnaryStreamMultiCallable[Any, Any]
    StreamUnaryMultiCallable = grpc.StreamUnaryMultiCallable[Any, Any]
    StreamStreamMultiCallable = grpc.StreamStreamMultiCallable[Any, Any]
    AioUnaryUnaryMultiCallable = aio.UnaryUnaryMultiCallable[Any, Any]
    AioUnaryStreamMultiCallable = aio.UnaryStreamMultiCallable[Any, Any]
    AioStreamUnaryMultiCallable = aio.StreamUnaryMultiCallable[Any, Any]
    AioStreamStreamMultiCallable = aio.StreamStreamMultiCallable[Any, Any]
    AioUnaryUnaryCall = aio.UnaryUnaryCall[Any, Any]
    AioUnaryStreamCall = aio.UnaryStreamCall[Any, Any]
    AioStreamUnaryCall = aio.StreamUnaryCall[Any, Any]
    AioStreamStreamCall = aio.StreamStreamCall[Any, Any]
else:
    UnaryUnaryMultiCallable = grpc.UnaryUnaryMultiCallable
    UnaryStreamMultiCallable = grpc.UnaryStreamMultiCallable
    StreamUnaryMultiCallable = grpc.StreamUnaryMultiCallable
    StreamStreamMultiCallable = grpc.StreamStreamMultiCallable
    AioUnaryUnaryMultiCallable = aio.UnaryUnaryMultiCallable
    AioUnaryStreamMultiCallable = aio.UnaryStreamMultiCallable
    AioStreamUnaryMultiCallable = aio.StreamUnaryMultiCallable
    AioStreamStreamMultiCallable = aio.StreamStreamMultiCallable
    AioUnaryUnaryCall = aio.UnaryUnaryCall
    AioUnaryStreamCall = aio.UnaryStreamCall
    AioStreamUnaryCall = aio.StreamUnaryCall
    AioStreamStreamCall = aio.StreamStreamCall
