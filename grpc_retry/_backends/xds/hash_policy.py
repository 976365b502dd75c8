"""A route's hash policies (gRFC A42): the request hash a ring_hash cluster's picks start from, computed per call as
gRPC's config selector computes it. A header policy hashes the header's values (joined with ",", after the
policy's regex rewrite) with XXH64; the channel-id policy (filter state `io.grpc.channel_id`) gives the channel's
own random 64-bit id. Each hash that a policy gives is folded into the call's: the call's so far rotated left by
one, XOR the new one; a terminal policy that leaves the call with a hash ends the fold. A call no policy hashes
gets a random hash (each call its own endpoint)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Optional, Pattern, Sequence, Tuple

from grpc_retry._backends.xds.errors import Errors
from grpc_retry._core import xxh64

CHANNEL_ID = "io.grpc.channel_id"
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class HashPolicy:
    header: str  # "": the channel-id policy
    pattern: Optional[Pattern[str]]
    substitution: str
    terminal: bool


@dataclass(frozen=True)
class RequestHash:
    policies: Tuple[HashPolicy, ...]

    def of(self, metadata: Optional[Sequence[Tuple[str, Any]]], channel_id: int) -> int:
        """The call's request hash (a random one if no policy gives one)."""
        value: Optional[int] = None
        for policy in self.policies:
            new: Optional[int] = channel_id
            if policy.header:
                text = header_value(metadata, policy.header)
                if text is not None and policy.pattern is not None:
                    text = policy.pattern.sub(policy.substitution, text)
                new = None if text is None else xxh64(text.encode())
            if new is not None:
                value = new if value is None else (((value << 1) | (value >> 63)) & _MASK) ^ new
            if policy.terminal and value is not None:
                break
        return random.getrandbits(64) if value is None else value


def describe(request_hash: RequestHash) -> str:
    """What xds-status shows of a route's hash policies, e.g. "header x-user (terminal), channel id"."""
    return ", ".join(("channel id" if not p.header else f"header {p.header}"
                      + (f" rewritten {p.pattern.pattern!r} -> {p.substitution!r}" if p.pattern else ""))
                     + (" (terminal)" if p.terminal else "") for p in request_hash.policies)


def header_value(metadata: Optional[Sequence[Tuple[str, Any]]], name: str) -> Optional[str]:
    """A header's value as gRPC's xDS filters see it: its values joined with ",", a binary one's never,
    content-type gRPC's."""
    if name.endswith("-bin"):
        return None
    if name == "content-type":
        return "application/grpc"
    values = [value for key, value in metadata or () if key == name and isinstance(value, str)]
    return ",".join(values) if values else None


def parse(action: Any, at: str, errors: Errors) -> Optional[RequestHash]:
    """A RouteAction's hash_policy (None: none that gRPC runs); what gRPC rejects, added to `errors`."""
    policies = []
    for k, policy in enumerate(action.hash_policy):
        where = f"{at}.hash_policy[{k}]"
        kind = policy.WhichOneof("policy_specifier")
        if kind == "header":
            header = policy.header
            if not header.header_name:
                errors.add(f"{where}.header.header_name", "must be non-empty")
                continue
            pattern, substitution = None, ""
            if header.HasField("regex_rewrite"):
                rewrite = header.regex_rewrite
                if not rewrite.HasField("pattern"):
                    errors.add(f"{where}.header.regex_rewrite.pattern", "field not present")
                    continue
                try:
                    pattern = re.compile(rewrite.pattern.regex)
                except re.error as error:
                    errors.add(f"{where}.header.regex_rewrite.pattern.regex", f"errors compiling regex: {error}")
                    continue
                substitution = rewrite.substitution
            policies.append(HashPolicy(header.header_name.lower(), pattern, substitution, policy.terminal))
        elif kind == "filter_state" and policy.filter_state.key == CHANNEL_ID:
            policies.append(HashPolicy("", None, "", policy.terminal))
    return RequestHash(tuple(policies)) if policies else None
