"""What a rejected xDS resource says: every problem found, by field path, as gRPC's core collects them (sorted,
each field's problems once); and what a call no route takes fails with (the routed channel's RouteError). Needs
no envoy protos."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from grpc_retry._routing import RouteError


class ResourceError(ValueError):
    """A resource gRPC's core would reject: `name` (None where it cannot be told) and every problem found."""

    def __init__(self, name: Optional[str], errors: List[str]) -> None:
        self.name = name
        self.errors = errors
        super().__init__("; ".join(errors))


class Errors:
    """The problems of one resource, as they are found."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind, self.name = kind, name
        self._by_field: Dict[str, List[str]] = {}

    def add(self, field: str, message: str) -> None:
        found = self._by_field.setdefault(field, [])
        if message not in found:
            found.append(message)

    def __bool__(self) -> bool:
        return bool(self._by_field)

    def count(self) -> int:
        return sum(len(messages) for messages in self._by_field.values())

    def raise_if_any(self) -> None:
        if self._by_field:
            raise ResourceError(self.name, [f"{field}: {message}" for field, messages in sorted(self._by_field.items())
                                            for message in sorted(messages)])


def type_name(url: str, at: str, errors: Errors) -> Optional[str]:
    """The type an Any holds: its URL after the last "/"; None, with the error at `at`, for a URL without a type."""
    if not url:
        errors.add(at, "field not present")
        return None
    slash = url.rfind("/")
    if slash < 0 or slash == len(url) - 1:
        errors.add(at, f'invalid value "{url}"')
        return None
    return url[slash + 1:]


def parsed(message_class: Any, data: bytes, kind: str) -> Any:
    """A resource's message from its bytes; ResourceError, as gRPC words it, if they are not one."""
    try:
        return message_class.FromString(data)
    except Exception:  # noqa: BLE001 (protobuf's DecodeError and its kin)
        raise ResourceError(None, [f"Can't parse {kind} resource."]) from None


__all__ = ["Errors", "ResourceError", "RouteError", "parsed", "type_name"]
