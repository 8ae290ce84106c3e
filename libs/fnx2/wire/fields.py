"""Strict readers for closed JSON field sets; every value is typed and bounded."""

from __future__ import annotations

import hashlib
import json
import re
from enum import Enum
from typing import Any, TypeVar

import msgspec

from libs.fnx2.wire.errors import ErrorCode, Fnx2Error

UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
MAX_TEXT_CHARS = 256
E = TypeVar("E", bound=Enum)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HASH = re.compile(r"sha256:[0-9a-f]{64}")


# msgspec writes the same bytes as `json.dumps(sort_keys=True, separators=(",", ":"),
# ensure_ascii=True)` whenever the output is printable ASCII without a backslash (no
# escapes, no non-ASCII, no DEL) and the value holds no float: msgspec spells exponents
# differently (`1e16`, `1e-7` where the standard form is `1e+16`, `1e-07`). Anything else
# takes the standard-library path, which is the definition of canonical.
_ENCODER = msgspec.json.Encoder(order="sorted")


class _FloatLiteral(Exception):
    """Raised by the fast decoder on the first float, to hand over to the standard library."""


def _refuse_float(_text: str) -> Any:
    raise _FloatLiteral


_DECODER = msgspec.json.Decoder(float_hook=_refuse_float)


def _needs_stdlib(data: bytes) -> bool:
    # Raw control characters never survive: msgspec refuses them in input and escapes
    # them (with a backslash) in output.
    return not data.isascii() or b"\\" in data or b"\x7f" in data


def holds_float(value: Any) -> bool:
    kind = type(value)
    if kind is float:
        return True
    if kind is dict:
        return any(holds_float(item) for item in value.values())
    if kind is list or kind is tuple:
        return any(holds_float(item) for item in value)
    return False


def canonical_json(value: Any, *, may_hold_floats: bool = True) -> bytes:
    """The canonical form. `may_hold_floats=False` is a promise by typed callers (every
    FNX2 message field is an integer, string, boolean or null) that spares the float scan."""
    fast = None
    if not (may_hold_floats and holds_float(value)):
        try:
            fast = _ENCODER.encode(value)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
            fast = None
    if fast is not None and not _needs_stdlib(fast):
        return fast
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite JSON number {name}")


def parse_json(data: bytes) -> Any:
    """json.loads semantics (last duplicate wins; NaN/Infinity rejected), faster for
    plain printable-ASCII input without floats."""
    return parse_json_noting_floats(data)[0]


def parse_json_noting_floats(data: bytes) -> tuple[Any, bool]:
    """(value, whether it may hold a float); False only when the fast path saw none."""
    if not _needs_stdlib(data):
        try:
            return _DECODER.decode(data), False
        except (msgspec.DecodeError, _FloatLiteral):
            pass  # the standard library decides, and names the error
    return json.loads(data, parse_constant=_reject_constant), True


def canonical_sha256(value: Any, *, may_hold_floats: bool = True) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value, may_hold_floats=may_hold_floats)).hexdigest()


def member(enum_type: type[E], value: Any) -> E | None:
    """The string enum member spelled `value`, or None for anything else, including JSON
    lists and objects (unhashable, so a plain `in` test on the value map would raise)."""
    if type(value) is not str:
        return None
    return enum_type._value2member_map_.get(value)  # type: ignore[return-value]


def is_uuid(value: Any) -> bool:
    return type(value) is str and _UUID.fullmatch(value) is not None


def is_hash(value: Any) -> bool:
    return type(value) is str and _HASH.fullmatch(value) is not None


class Fields:
    """Reads one JSON object with an exact field set, raising `code` on any violation."""

    __slots__ = ("_meta", "_code", "_what")

    def __init__(self, meta: Any, code: ErrorCode, what: str, names: frozenset[str]) -> None:
        if type(meta) is not dict:
            raise Fnx2Error(code, f"{what} must be an object")
        if meta.keys() != names:
            missing = sorted(names - meta.keys())[:4]
            unknown = sorted(meta.keys() - names)[:4]
            raise Fnx2Error(code, f"{what} fields: missing {missing} unknown {unknown}")
        self._meta, self._code, self._what = meta, code, what

    def fail(self, name: str, reason: str) -> Fnx2Error:
        return Fnx2Error(self._code, f"{self._what}.{name} {reason}")

    def raw(self, name: str) -> Any:
        return self._meta[name]

    def has(self, name: str) -> bool:
        return name in self._meta

    def uuid(self, name: str) -> str:
        value = self._meta[name]
        if not is_uuid(value):
            raise self.fail(name, "must be a lower-case canonical UUID")
        return value

    def hash(self, name: str) -> str:
        value = self._meta[name]
        if not is_hash(value):
            raise self.fail(name, "must be sha256:<64 lower-case hex>")
        return value

    def text(self, name: str, limit: int = MAX_TEXT_CHARS) -> str:
        value = self._meta[name]
        if type(value) is not str or not value or len(value) > limit:
            raise self.fail(name, f"must be a non-empty string of at most {limit} chars")
        return value

    def uint(self, name: str, maximum: int = UINT64_MAX, minimum: int = 0) -> int:
        value = self._meta[name]
        if type(value) is not int or value < minimum or value > maximum:
            raise self.fail(name, f"must be an integer in [{minimum}, {maximum}]")
        return value

    def optional_uint(self, name: str, maximum: int = UINT64_MAX) -> int | None:
        return None if self._meta[name] is None else self.uint(name, maximum)

    def boolean(self, name: str) -> bool:
        value = self._meta[name]
        if type(value) is not bool:
            raise self.fail(name, "must be a boolean")
        return value

    def array(self, name: str, limit: int) -> list[Any]:
        value = self._meta[name]
        if type(value) is not list or len(value) > limit:
            raise self.fail(name, f"must be an array of at most {limit} items")
        return value
