"""The chat template from a checkpoint's tokenizer_config.json, rendered in a jinja2 sandbox."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from libs.text.errors import TemplateError, TemplateHashMismatch
from libs.text.tokenizer import sha256_hex

CHAT_ROLES = ("system", "user", "assistant", "tool")
# Newer Hugging Face checkpoints keep the template in its own file, which then wins.
CHAT_TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True)
class ToolCall:
    """One function call an assistant made; arguments are JSON text, as OpenAI carries them."""

    call_id: str
    name: str
    arguments: str

    def as_template_value(self) -> dict:
        return {"id": self.call_id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # role "tool": the call this message answers

    def as_template_value(self) -> dict:
        """What the template sees: transformers' message dict shape."""
        value: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            value["tool_calls"] = [c.as_template_value() for c in self.tool_calls]
        if self.tool_call_id is not None:
            value["tool_call_id"] = self.tool_call_id
        return value


@dataclass(frozen=True)
class TemplateIdentity:
    source: str
    sha256: str


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def _tojson(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A compiled chat template with its pinned identity (sha256 of the template text)."""

    def __init__(self, source_text: str, identity: TemplateIdentity,
                 special_tokens: dict[str, str]) -> None:
        # The environment transformers' apply_chat_template uses, so a checkpoint's template
        # renders the same prompt here as there (lenient undefined values included).
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source_text)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template {identity.source}: {exc}") from exc
        self.identity = identity
        self._special_tokens = dict(special_tokens)

    @classmethod
    def from_checkpoint(cls, root: str | Path, expected_sha256: str | None = None) -> ChatTemplate:
        """`chat_template.jinja` when the checkpoint has one, else tokenizer_config.json's."""
        jinja_path = Path(root) / CHAT_TEMPLATE_FILE
        if not jinja_path.is_file():
            return cls.from_tokenizer_config(Path(root) / "tokenizer_config.json",
                                             expected_sha256)
        raw = jinja_path.read_bytes()
        digest = sha256_hex(raw)
        if expected_sha256 is not None and digest != expected_sha256:
            raise TemplateHashMismatch(f"chat template {jinja_path}: sha256 {digest} does not "
                                       f"match pinned {expected_sha256}")
        config = json.loads((Path(root) / "tokenizer_config.json").read_text(encoding="utf-8"))
        return cls(raw.decode("utf-8"), TemplateIdentity(source=str(jinja_path), sha256=digest),
                   _special_tokens(config))

    @classmethod
    def from_tokenizer_config(cls, path: str | Path,
                              expected_sha256: str | None = None) -> ChatTemplate:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
        source_text = config.get("chat_template")
        if not isinstance(source_text, str) or not source_text:
            raise TemplateError(f"{path}: `chat_template` is missing or not a single string")
        digest = sha256_hex(source_text.encode("utf-8"))
        if expected_sha256 is not None and digest != expected_sha256:
            raise TemplateHashMismatch(
                f"chat template in {path}: sha256 {digest} does not match pinned "
                f"{expected_sha256}")
        return cls(source_text, TemplateIdentity(source=str(path), sha256=digest),
                   _special_tokens(config))

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """Renders the conversation (and the tool definitions, when given) as prompt text."""
        if not messages:
            raise TemplateError("a conversation needs at least one message")
        context = {"messages": [m.as_template_value() for m in messages],
                   "add_generation_prompt": add_generation_prompt}
        if tools:
            context["tools"] = tools
        context.update({k: v for k, v in self._special_tokens.items()})
        context.setdefault("bos_token", "")
        context.setdefault("eos_token", "")
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template {self.identity.source}: {exc}") from exc


def _special_tokens(config: dict) -> dict[str, str]:
    specials = {key: _token_text(config.get(key))
                for key in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return {k: v for k, v in specials.items() if v is not None}


def _token_text(value: object) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None
