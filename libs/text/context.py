"""Tokenizer + chat template of one checkpoint, loaded together and pinned by hash."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from libs.text.chat_template import ChatMessage, ChatTemplate
from libs.text.detokenizer import TextStream
from libs.text.errors import UnsupportedTokenizer
from libs.text.tokenizer import ProjectTokenizer


@dataclass(frozen=True)
class TextIdentity:
    """What a request was tokenized with; recorded with every request."""

    tokenizer_sha256: str
    template_sha256: str


@dataclass(frozen=True)
class TextPins:
    """Expected hashes; None means "record whatever is there" (exploratory use)."""

    tokenizer_sha256: str | None = None
    template_sha256: str | None = None


class TextContext:
    def __init__(self, tokenizer: ProjectTokenizer, template: ChatTemplate,
                 eos_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.eos_token_ids = eos_token_ids
        self.identity = TextIdentity(tokenizer_sha256=tokenizer.identity.sha256,
                                     template_sha256=template.identity.sha256)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path,
                        pins: TextPins = TextPins()) -> TextContext:
        root = Path(checkpoint_dir)
        tokenizer = ProjectTokenizer.from_file(root / "tokenizer.json", pins.tokenizer_sha256)
        template = ChatTemplate.from_checkpoint(root, pins.template_sha256)
        return cls(tokenizer, template, _eos_token_ids(root, tokenizer))

    def encode_chat(self, messages: list[ChatMessage], tools: list[dict] | None = None) -> list[int]:
        return self.tokenizer.encode(self.template.render(messages, tools=tools))

    def stream(self, stop: tuple[str, ...] = ()) -> TextStream:
        return TextStream(self.tokenizer.token_bytes, self.tokenizer.special_ids, stop)


def _eos_token_ids(root: Path, tokenizer: ProjectTokenizer) -> frozenset[int]:
    """Ids that end generation: config.json's eos_token_id(s) and tokenizer_config's eos."""
    ids: set[int] = set()
    config_path = root / "config.json"
    if config_path.exists():
        eos = json.loads(config_path.read_text(encoding="utf-8")).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else [e for e in eos or [] if isinstance(e, int)])
    tok_config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos_text = tok_config.get("eos_token")
    if isinstance(eos_text, dict):
        eos_text = eos_text.get("content")
    eos_id = tokenizer.token_id(eos_text) if isinstance(eos_text, str) else None
    if eos_id is not None:
        ids.add(eos_id)
    if not ids:
        raise UnsupportedTokenizer(f"{root}: no eos_token_id in config.json and no known "
                                   "eos_token in tokenizer_config.json")
    return frozenset(ids)
