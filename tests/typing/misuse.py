"""Misuses of grpc_retry's API that mypy --strict must reject: tests/unit/test_typing.py asserts that each line
marked with an E: comment is reported, and that nothing else is. Never run; only type-checked."""

from __future__ import annotations

import grpc_retry
import grpc_retry.aio
from grpc_retry.strategy import StandardRetryPolicy, StandardRetryStrategy

grpc_retry.insecure_chanel("localhost:50051")  # E: a typo of the constructor
grpc_retry.insecure_channel(50051)  # E: a target is a string
grpc_retry.aio.insecure_channel("localhost:50051", interceptors=3)  # E: interceptors are a sequence
channel = grpc_retry.insecure_channel("localhost:50051")
stats = channel.retry_stats()
attempts: str = stats["/pkg.Service/Method"].retries  # E: a count is an int
tries = stats["/pkg.Service/Method"].tries  # E: no such statistic
stats["/pkg.Service/Method"] = stats["/pkg.Service/Method"]  # E: a snapshot cannot be changed
tokens: int = channel.throttle_tokens  # E: tokens are Optional[float]
with grpc_retry.insecure_channel("localhost:50051") as ch:
    ch.unary_unary(42)  # E: a method name is a string
grpc_retry.install(all_channels="yes")  # E: a bool
StandardRetryStrategy().retry(StandardRetryPolicy(), 42)  # E: the block is a callable
