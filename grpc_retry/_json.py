"""JSON as gRPC reads a service config: proto3 JSON's numbers (strings of them too) and durations, keys given
twice, and a reader that records every error with its field path rather than stopping at the first."""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterator, Optional, Tuple, TypeVar

from google.protobuf import duration_pb2

from grpc_retry._suggest import closest, hint

_DURATION = re.compile(r"-?([0-9]+(\.[0-9]{1,9})?|\.[0-9]{1,9})s")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")  # proto3 JSON: numbers as strings too
_MAX_DIGITS = 400      # a JSON number longer than this is nobody's config value
_MAX_EXPONENT = 10000  # nor one whose exponent is larger than this
SHOWN = 60             # at most this much of a value is echoed in a message
LISTED = 20            # at most this many problems are listed in a message; the rest are counted
_T = TypeVar("_T")
_OUT_OF_RANGE = object()  # a numeric string too long or too large (its error recorded)


def show(value: Any) -> str:
    """A value as a message echoes it: its repr, cut to SHOWN characters."""
    text = repr(value) if not isinstance(value, Decimal) else str(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def cut(text: str) -> str:
    return text if len(text) <= 2 * SHOWN else text[:2 * SHOWN - 3] + "..."


def listing(problems: list[str]) -> str:
    """Problems as one message lists them: the first LISTED, and how many more."""
    shown = "; ".join(problems[:LISTED])
    return shown if len(problems) <= LISTED else f"{shown}; and {len(problems) - LISTED} more"


def decode(text: str) -> Any:
    """The document: numbers as Decimal or int (bounded), objects that remember keys given twice; ValueError,
    TypeError or RecursionError if it is not JSON."""
    return json.loads(text, parse_float=_decimal, parse_int=_int, parse_constant=_reject_constant,
                      object_pairs_hook=_object)


class _Object(dict):  # type: ignore[type-arg]
    """A decoded JSON object that remembers the keys it was given more than once."""

    duplicates: Tuple[str, ...] = ()


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    duplicates = []
    for key, value in pairs:
        if key in obj:
            duplicates.append(key)
        obj[key] = value
    if duplicates:
        obj.duplicates = tuple(duplicates)
    return obj


def _decimal(text: str) -> Decimal:
    if len(text) > _MAX_DIGITS:
        raise ValueError(f"number {show(text)} is too long")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"number {show(text)} is out of range") from None
    if abs(number.adjusted()) > _MAX_EXPONENT:
        raise ValueError(f"number {show(text)} is out of range")
    return number


def _int(text: str) -> int:
    if len(text) > _MAX_DIGITS:
        raise ValueError(f"number {show(text)} is too long")
    return int(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _walk(doc: Any) -> Iterator[tuple[str, Any]]:
    """Every value of a decoded document with its path, without recursion (the document may be deep)."""
    stack: list[tuple[str, Any]] = [("<root>", doc)]
    while stack:
        path, value = stack.pop()
        yield path, value
        if isinstance(value, dict):
            stack.extend((key if path == "<root>" else f"{path}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))


class JsonReader:
    """Reads decoded JSON: each method returns the value read, or None after recording the error with its path;
    warnings are kept apart."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []
        # The path of a known key -> the unknown key written next to it that is closest to it: a required key
        # found missing names its likely misspelling.
        self.misspelt: dict[str, str] = {}

    def error(self, path: str, reason: str) -> None:
        self.errors.append(f"{path}: {reason}")

    def duplicates(self, doc: Any) -> None:
        """gRPC rejects a key given twice in any object, known or not."""
        for path, value in _walk(doc):
            for key in getattr(value, "duplicates", ()):
                self.error(path, f"duplicate key {show(key)}")

    def unknown_keys(self, obj: dict[str, Any], path: str, known: Tuple[str, ...]) -> None:
        """A warning for each key of `obj` not among `known`, with the known key it is closest to. Call it before
        get() on `obj`: a required key missing is then reported with its misspelling."""
        folded = {k.lower() for k in known}
        for key in obj:
            if key not in known and key.lower() not in folded:  # (a known key in another case is read: get())
                near = closest(key, known)
                where = key if path == "<root>" else f"{path}.{key}"
                self.warnings.append(f"{where}: unknown key, ignored{hint(near)}")
                if near is not None:
                    self.misspelt.setdefault(near if path == "<root>" else f"{path}.{near}", key)

    def get(self, obj: dict[str, Any], path: str, key: str, kind: Callable[[Any, str], Optional[_T]],
            required: bool = False) -> Optional[_T]:
        path = f"{path}.{key}" if path else key
        value = obj.get(key)
        if value is None and key not in obj:
            # grpc-go reads keys whatever their case (its published retry example writes "MaxAttempts"); gRPC's
            # core does not. Read it, and say so.
            written = next((k for k in obj if k.lower() == key.lower()), None)
            if written is not None:
                value = obj[written]
                self.warnings.append(f"{path[: -len(key)]}{written}: read as {key!r} (gRPC's core reads keys "
                                     "case-sensitively and would ignore it)")
        if value is None:
            if required:
                written = self.misspelt.get(path)
                self.error(path, "is required" if written is None else
                           f"is required (found {show(written)}: did you mean {key!r}?)")
            return None
        return kind(value, path)

    def check(self, value: Optional[_T], path: str, ok: Callable[[_T], bool], reason: str) -> Optional[_T]:
        if value is not None and not ok(value):
            self.error(path, reason)
            return None
        return value

    # JSON types

    def json_object(self, value: Any, path: str) -> Optional[dict[str, Any]]:
        if isinstance(value, dict):
            return value
        self.error(path, "must be an object")
        return None

    def json_list(self, value: Any, path: str) -> Optional[list[Any]]:
        if isinstance(value, list):
            return value
        self.error(path, "must be a list")
        return None

    def json_string(self, value: Any, path: str) -> Optional[str]:
        if isinstance(value, str):
            return value
        self.error(path, "must be a string")
        return None

    def json_bool(self, value: Any, path: str) -> Optional[bool]:
        if isinstance(value, bool):
            return value
        self.error(path, "must be a boolean")
        return None

    def integer(self, value: Any, path: str) -> Optional[int]:
        """An integer, as proto3 JSON writes one: a number with no fraction, or a string of one."""
        value = self._unquoted(value, path)
        if value is _OUT_OF_RANGE:
            return None
        if isinstance(value, Decimal) and value == value.to_integral_value():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        self.error(path, "must be an integer or an integer string")
        return None

    def number(self, value: Any, path: str) -> Optional[Decimal]:
        """A number, as proto3 JSON writes one: a JSON number or a numeric string."""
        value = self._unquoted(value, path)
        if value is _OUT_OF_RANGE:
            return None
        if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
            return Decimal(value)
        self.error(path, "must be a number or a numeric string")
        return None

    def _unquoted(self, value: Any, path: str) -> Any:
        """A numeric string as the Decimal it writes (proto3 JSON allows numbers as strings), else `value` as it is;
        _OUT_OF_RANGE once the error is recorded."""
        if isinstance(value, str) and _NUMBER.fullmatch(value):
            try:
                return _decimal(value)
            except ValueError:
                self.error(path, f"number {show(value)} is out of range")
                return _OUT_OF_RANGE
        return value

    def duration(self, value: Any, path: str) -> Optional[float]:
        """A proto3 JSON Duration such as "1.5s", in seconds."""
        if not isinstance(value, str):
            self.error(path, 'must be a duration string such as "1.5s"')
            return None
        if not _DURATION.fullmatch(value):
            self.error(path, f'invalid duration {show(value)} (expected e.g. "1.5s")')
            return None
        if value.lstrip("-").startswith("."):
            value = value.replace(".", "0.", 1)
        try:
            duration_pb2.Duration().FromJsonString(value)
        except ValueError:
            self.error(path, f"duration {show(value)} is out of range")
            return None
        return float(value[:-1])
