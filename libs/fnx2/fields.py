"""Strict readers for closed JSON field sets; every value is typed and bounded."""

from __future__ import annotations

import hashlib
import json
import re

import msgspec
from typing import Any

from libs.fnx2.errors import ErrorCode, Fnx2Error

UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
MAX_TEXT_CHARS = 256
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HASH = re.compile(r"sha256:[0-9a-f]{64}")


# msgspec writes the same bytes as `json.dumps(sort_keys=True, separators=(",", ":"),
# ensure_ascii=True)` whenever the output is printable ASCII without a backslash (no
# escapes, no non-ASCII, no DEL); anything else takes the standard-library path, which is
# the definition of canonical.
_ENCODER = msgspec.json.Encoder(order="sorted")
_DECODER = msgspec.json.Decoder()


def _needs_stdlib(data: bytes) -> bool:
    # Raw control characters never survive: msgspec refuses them in input and escapes
    # them (with a backslash) in output.
    return not data.isascii() or b"\\" in data or b"\x7f" in data


def canonical_json(value: Any) -> bytes:
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
    plain printable-ASCII input."""
    if not _needs_stdlib(data):
        try:
            return _DECODER.decode(data)
        except msgspec.DecodeError:
            pass  # the standard library decides, and names the error
    return json.loads(data, parse_constant=_reject_constant)


def canonical_sha256(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


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
