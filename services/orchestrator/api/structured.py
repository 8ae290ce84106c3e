"""Structured outputs at the request layer: `response_format` and forced tool calls become one
grammar (llguidance Lark) that the final stage applies as a token mask before every sample.

The orchestrator checks each grammar against the tokenizer before admitting the request, so
an unsupported JSON schema is a 400 that names the unsupported keywords, never a stage-side
failure mid-stream.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from libs.service.errors import InvalidArgument
from libs.structured.grammar import GrammarSpec, GrammarVocabulary, json_lark
from libs.text.context import TextContext

_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_OBJECT: dict[str, Any] = {"type": "object"}


class ResponseFormatKind(enum.Enum):
    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"


@dataclass(frozen=True)
class ResponseFormat:
    kind: ResponseFormatKind
    schema: dict[str, Any] | None = None
    name: str | None = None


TEXT_FORMAT = ResponseFormat(ResponseFormatKind.TEXT)


def _bad(param: str, reason: str, message: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, field=param)


def parse_response_format(value: Any) -> ResponseFormat:
    param = "response_format"
    if value is None:
        return TEXT_FORMAT
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _bad(param, "INVALID_RESPONSE_FORMAT", "response_format must be an object with a type")
    try:
        kind = ResponseFormatKind(value["type"])
    except ValueError:
        raise _bad(f"{param}.type", "INVALID_RESPONSE_FORMAT",
                   "response_format.type must be text, json_object or json_schema") from None
    if kind is not ResponseFormatKind.JSON_SCHEMA:
        if set(value) != {"type"}:
            raise _bad(param, "INVALID_RESPONSE_FORMAT",
                       f"response_format of type {kind.value} takes no other fields")
        return ResponseFormat(kind)
    return _json_schema_format(value.get("json_schema"), f"{param}.json_schema")


def _json_schema_format(spec: Any, param: str) -> ResponseFormat:
    if not isinstance(spec, dict) or set(spec) - {"name", "schema", "strict", "description"}:
        raise _bad(param, "INVALID_RESPONSE_FORMAT",
                   "json_schema must be an object with name, schema, and optionally strict "
                   "and description")
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise _bad(f"{param}.name", "INVALID_RESPONSE_FORMAT",
                   "json_schema.name must be 1-64 letters, digits, '_' or '-'")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise _bad(f"{param}.strict", "INVALID_TYPE", "json_schema.strict must be a boolean")
    schema = spec.get("schema", _JSON_OBJECT)
    check_schema(schema, f"{param}.schema")
    return ResponseFormat(ResponseFormatKind.JSON_SCHEMA, schema, name)


def check_schema(schema: Any, param: str) -> None:
    """The schema itself must be valid JSON Schema (2020-12 metaschema)."""
    if not isinstance(schema, dict):
        raise _bad(param, "INVALID_SCHEMA", f"{param} must be a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _bad(param, "INVALID_SCHEMA", f"{param} is not a valid JSON Schema: "
                                            f"{exc.message}") from exc


def response_format_lark(fmt: ResponseFormat) -> str | None:
    if fmt.kind is ResponseFormatKind.TEXT:
        return None
    schema = fmt.schema if fmt.kind is ResponseFormatKind.JSON_SCHEMA else _JSON_OBJECT
    if schema is None:
        raise _bad("response_format", "INVALID_RESPONSE_FORMAT", "response_format.json_schema needs a schema")
    return json_lark(schema)


class GrammarChecker:
    """Builds grammar specs for one tokenizer and checks them before admission."""

    def __init__(self, text: TextContext, vocab_size: int) -> None:
        tokenizer_json = Path(text.tokenizer.identity.path).read_text(encoding="utf-8")
        self._vocab = GrammarVocabulary(tokenizer_json, vocab_size)
        self._end_ids = tuple(sorted(text.eos_token_ids))

    def spec(self, lark: str, param: str) -> GrammarSpec:
        spec = GrammarSpec(lark, self._end_ids)
        self._vocab.check(spec, param)
        return spec


_CHECKERS: dict[tuple[str, int], GrammarChecker] = {}


def grammar_checker(text: TextContext, vocab_size: int) -> GrammarChecker:
    """One checker per (tokenizer, vocabulary size): building it reads the tokenizer."""
    key = (text.tokenizer.identity.sha256, vocab_size)
    if key not in _CHECKERS:
        _CHECKERS[key] = GrammarChecker(text, vocab_size)
    return _CHECKERS[key]
