"""grpc_retry for grpc's synchronous API: drop-in replacements for grpc.insecure_channel / secure_channel."""

from grpc_retry.sync._channel import Channel, insecure_channel, secure_channel

__all__ = ["Channel", "insecure_channel", "secure_channel"]
