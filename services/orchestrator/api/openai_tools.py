"""OpenAI tool calling: `tools` and `tool_choice` in, assistant `tool_calls` out.

Tools reach the model through the chat template; the model answers a call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (the Hermes/Qwen shape the
template teaches). With `required` or a named function the final stage constrains the output to
exactly that shape, the arguments to the function's parameter schema; with `auto` the model
may write text or calls, and only well-formed calls to declared tools become `tool_calls`.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from libs.service.errors import InvalidArgument
from libs.structured.grammar import json_lark, lark_string
from libs.text.chat_template import ToolCall
from services.orchestrator.api.structured import check_schema

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NO_PARAMETERS = {"type": "object", "properties": {}}


class ToolChoiceMode(enum.Enum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True)
class FunctionTool:
    name: str
    parameters: dict[str, Any]
    description: str | None = None

    def as_template_value(self) -> dict:
        function = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[FunctionTool, ...] = ()
    mode: ToolChoiceMode = ToolChoiceMode.NONE
    named: str | None = None

    @property
    def active(self) -> bool:
        """Whether the output may hold calls (and so is parsed for them)."""
        return bool(self.tools) and self.mode is not ToolChoiceMode.NONE

    @property
    def forced(self) -> bool:
        return self.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)

    def template_tools(self) -> list[dict] | None:
        return [t.as_template_value() for t in self.tools] or None


def _bad(param: str, reason: str, message: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, field=param)


def parse_tools(body: dict[str, Any]) -> ToolRequest:
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "INVALID_TYPE", "parallel_tool_calls must be a boolean")
    if choice is None:
        return ToolRequest(tools, ToolChoiceMode.AUTO if tools else ToolChoiceMode.NONE)
    if isinstance(choice, str):
        try:
            mode = ToolChoiceMode(choice)
        except ValueError:
            mode = ToolChoiceMode.NAMED
        if mode is ToolChoiceMode.NAMED:
            raise _bad("tool_choice", "INVALID_TOOL_CHOICE",
                       "tool_choice must be none, auto, required or a named function")
        if mode is not ToolChoiceMode.NONE and not tools:
            raise _bad("tool_choice", "INVALID_TOOL_CHOICE", f"tool_choice {choice} needs tools")
        return ToolRequest(tools, mode)
    return ToolRequest(tools, ToolChoiceMode.NAMED, _named_choice(choice, tools))


def _named_choice(choice: Any, tools: tuple[FunctionTool, ...]) -> str:
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise _bad("tool_choice", "INVALID_TOOL_CHOICE",
                   'tool_choice must be a string or {"type": "function", "function": {"name": ...}}')
    if name not in {t.name for t in tools}:
        raise _bad("tool_choice.function.name", "INVALID_TOOL_CHOICE",
                   f"tool_choice names {name!r}, which is not among the tools")
    return name


def _tools(value: Any) -> tuple[FunctionTool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value or len(value) > 128:
        raise _bad("tools", "INVALID_TOOLS", "tools must be a list of 1 to 128 tools")
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(value))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise _bad("tools", "INVALID_TOOLS", "tool function names must be unique")
    return tools


def _tool(value: Any, where: str) -> FunctionTool:
    if not isinstance(value, dict) or value.get("type") != "function" or set(value) - {"type", "function"}:
        raise _bad(where, "INVALID_TOOLS", f'{where} must be {{"type": "function", "function": {{...}}}}')
    function = value.get("function")
    if not isinstance(function, dict) or set(function) - {"name", "description", "parameters", "strict"}:
        raise _bad(f"{where}.function", "INVALID_TOOLS",
                   f"{where}.function takes name, description, parameters and strict")
    name = function.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise _bad(f"{where}.function.name", "INVALID_TOOLS",
                   "function names are 1-64 letters, digits, '_' or '-'")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{where}.function.description", "INVALID_TYPE", "description must be a string")
    parameters = function.get("parameters", _NO_PARAMETERS)
    check_schema(parameters, f"{where}.function.parameters")
    return FunctionTool(name, parameters, description)


def forced_call_lark(request: ToolRequest) -> str:
    """Exactly one call: to the named function, or (required) to any declared one."""
    chosen = [t for t in request.tools if request.named in (None, t.name)]
    schema = {"anyOf": [_call_schema(t) for t in chosen]} if len(chosen) > 1 else _call_schema(chosen[0])
    return (f"start: {lark_string(CALL_OPEN)} call {lark_string(CALL_CLOSE)}\n"
            + json_lark(schema, rule="call"))


def output_lark(request: ToolRequest, answer_lark: str | None) -> str | None:
    """The grammar of a chat answer: a forced call, a call or a formatted answer (auto with a
    response_format), just the response_format, or nothing."""
    if request.forced:
        return forced_call_lark(request)
    if answer_lark is None:
        return None
    if not request.active:
        return answer_lark
    calls = forced_call_lark(ToolRequest(request.tools, ToolChoiceMode.REQUIRED))
    return ("start: call_block | answer\n"
            + calls.replace("start:", "call_block:", 1)
            + answer_lark.replace("start:", "answer:", 1))


def _call_schema(tool: FunctionTool) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def extract_calls(text: str, request: ToolRequest) -> tuple[str, tuple[ToolCall, ...]]:
    """Content and calls of an output: well-formed calls to declared tools are taken out of
    the text; anything else stays content."""
    known = {t.name for t in request.tools}
    calls, kept, last = [], [], 0
    for match in _CALL.finditer(text):
        call = _parse_call(match.group(1), known)
        if call is None:
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    return "".join(kept).strip() if calls else text, tuple(calls)


def _parse_call(raw: str, known: set[str]) -> ToolCall | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if (not isinstance(value, dict) or value.get("name") not in known
            or not isinstance(value.get("arguments"), dict)):
        return None
    arguments = json.dumps(value["arguments"], ensure_ascii=False, separators=(",", ":"))
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], arguments)


class CallStreamSplitter:
    """Streaming: text is passed on as content until it could be the start of a call; from a
    call's opening tag on, the rest is held and parsed when the output ends."""

    def __init__(self, request: ToolRequest) -> None:
        self._request = request
        self._held = ""
        self._in_call = request.forced

    def feed(self, text: str) -> str:
        """The part of `text` that is certainly content."""
        if self._in_call:
            self._held += text
            return ""
        self._held += text
        start = self._held.find("<")
        while start != -1:
            tail = self._held[start:]
            if tail.startswith(CALL_OPEN) or CALL_OPEN.startswith(tail):
                self._in_call = tail.startswith(CALL_OPEN) or self._in_call
                emit, self._held = self._held[:start], self._held[start:]
                return emit
            start = self._held.find("<", start + 1)
        emit, self._held = self._held, ""
        return emit

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """Content still held and the calls found in it."""
        held, self._held = self._held, ""
        return extract_calls(held, self._request)
