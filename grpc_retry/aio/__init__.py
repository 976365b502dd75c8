"""grpc_retry for asyncio: drop-in replacements for grpc.aio.insecure_channel / secure_channel."""

from grpc_retry.aio._channel import Channel, insecure_channel, secure_channel

__all__ = ["Channel", "insecure_channel", "secure_channel"]
