"""Settings sections: frozen dataclasses whose every field is one environment variable.

A section declares each setting once, with `setting(variable, default, codec)`: the field's
default is the setting's only default, and the codec both parses the variable (a bad value
stops with an `InvalidArgument` that names it) and writes it back, so launchers build a section
and pass `to_env()` to a child instead of spelling variable names. An unset or empty variable
keeps the default. `read_env(cls, env)` and `write_env(section)` are the shared halves of every
section's `from_env` and `to_env`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from libs.service.errors import InvalidArgument

T = TypeVar("T")
S = TypeVar("S")
E = TypeVar("E", bound=Enum)
ENV_KEY = "fornax_env"
CODEC_KEY = "fornax_codec"


@dataclass(frozen=True)
class Codec:
    """How one variable's text becomes a value (`parse(raw, variable)`) and back (`format`)."""

    parse: Callable[[str, str], Any]
    format: Callable[[Any], str]
    # Whether None is a value with its own spelling; otherwise None is written as unset.
    writes_none: bool = False


def invalid(variable: str, raw: str, expected: str, reason: str = "INVALID_SETTING") -> InvalidArgument:
    return InvalidArgument(f"{variable}={raw!r} is not {expected}", reason=reason, field=variable)


def setting(variable: str, default: Any, codec: Codec) -> Any:
    """A dataclass field read from `variable`; `default` is the setting's one default."""
    metadata = {ENV_KEY: variable, CODEC_KEY: codec}
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings are immutable: use a tuple")
    return dataclasses.field(default=default, metadata=metadata)


def variables(cls: type) -> dict[str, str]:
    """Field name -> variable name of a section."""
    return {f.name: f.metadata[ENV_KEY] for f in dataclasses.fields(cls) if ENV_KEY in f.metadata}


def read_env(cls: type[S], env: Mapping[str, str]) -> S:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if ENV_KEY not in f.metadata:
            continue
        raw = env.get(f.metadata[ENV_KEY])
        if raw is not None and raw != "":
            values[f.name] = f.metadata[CODEC_KEY].parse(raw, f.metadata[ENV_KEY])
    return cls(**values)


def parse_setting(cls: type, name: str, raw: str) -> Any:
    """The value that `raw`, as the text of setting `name`'s variable, means (an error names it)."""
    f = next((f for f in dataclasses.fields(cls) if f.name == name and ENV_KEY in f.metadata), None)
    if f is None:
        raise KeyError(f"{cls.__name__} has no setting {name}")
    return f.metadata[CODEC_KEY].parse(raw, f.metadata[ENV_KEY])


def write_env(section: Any, fields: Iterable[str] = ()) -> dict[str, str]:
    """The variables that reproduce `section` (every setting, or only `fields`).

    A setting whose value is None is left out (unset is how None is said) unless its codec
    spells None."""
    names = variables(type(section))
    chosen = tuple(fields) or tuple(names)
    unknown = [name for name in chosen if name not in names]
    if unknown:
        raise KeyError(f"{type(section).__name__} has no setting {', '.join(unknown)}")
    codecs = {f.name: f.metadata[CODEC_KEY] for f in dataclasses.fields(section) if ENV_KEY in f.metadata}
    env: dict[str, str] = {}
    for name in chosen:
        value = getattr(section, name)
        if value is not None or codecs[name].writes_none:
            env[names[name]] = codecs[name].format(value)
    return env


def text() -> Codec:
    return Codec(lambda raw, variable: raw, str)


def integer(minimum: int = 0) -> Codec:
    def parse(raw: str, variable: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise invalid(variable, raw, "an integer") from None
        if value < minimum:
            raise invalid(variable, raw, f"an integer >= {minimum}")
        return value

    return Codec(parse, str)


def number(minimum: float = 0.0, *, exclusive: bool = False) -> Codec:
    def parse(raw: str, variable: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise invalid(variable, raw, "a number") from None
        if value != value or value < minimum or (exclusive and value == minimum):
            raise invalid(variable, raw, f"a number {'>' if exclusive else '>='} {minimum:g}")
        return value

    return Codec(parse, repr)


def switch() -> Codec:
    """1, true or yes turn it on; anything else leaves it off."""
    return Codec(lambda raw, variable: raw.lower() in ("1", "true", "yes"), lambda on: "1" if on else "0")


def choice(kind: type[E], reason: str = "INVALID_SETTING") -> Codec:
    def parse(raw: str, variable: str) -> E:
        try:
            return kind(raw)
        except ValueError:
            raise invalid(variable, raw, "one of " + ", ".join(str(m.value) for m in kind), reason) from None

    return Codec(parse, lambda member: str(member.value))


def one_of(values: tuple[str, ...], reason: str = "INVALID_SETTING") -> Codec:
    def parse(raw: str, variable: str) -> str:
        if raw not in values:
            raise invalid(variable, raw, "one of " + ", ".join(values), reason)
        return raw

    return Codec(parse, str)


def listed(item: Codec, separator: str = ",") -> Codec:
    """A tuple of items, e.g. "a:1, b:2"; blank items are skipped."""
    def parse(raw: str, variable: str) -> tuple:
        return tuple(item.parse(part.strip(), variable) for part in raw.split(separator) if part.strip())

    return Codec(parse, lambda values: separator.join(item.format(v) for v in values))


def converted(parse: Callable[[str], T], fmt: Callable[[T], str], expected: str) -> Codec:
    """A codec from a plain parser whose ValueError means a bad value."""
    def checked(raw: str, variable: str) -> T:
        try:
            return parse(raw)
        except ValueError:
            raise invalid(variable, raw, expected) from None

    return Codec(checked, fmt)
