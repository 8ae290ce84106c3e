from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from libs.text.chat_template import ChatMessage, ChatTemplate
from libs.text.context import TextContext, TextPins
from libs.text.errors import (
    TemplateError,
    TemplateHashMismatch,
    TokenizerHashMismatch,
    UnsupportedTokenizer,
)
from libs.text.tokenizer import ProjectTokenizer, sha256_hex


def test_identity_records_sha256_of_the_files(text_dir: Path, text_context: TextContext):
    raw = (text_dir / "tokenizer.json").read_bytes()
    template = json.loads((text_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert text_context.identity.tokenizer_sha256 == sha256_hex(raw)
    assert text_context.identity.template_sha256 == sha256_hex(template.encode())


def test_matching_pins_load(text_dir: Path, text_context: TextContext):
    pins = TextPins(text_context.identity.tokenizer_sha256, text_context.identity.template_sha256)
    assert TextContext.from_checkpoint(text_dir, pins).identity == text_context.identity


def test_tokenizer_pin_mismatch_is_a_specific_error(text_dir: Path):
    with pytest.raises(TokenizerHashMismatch, match="does not match pinned") as info:
        ProjectTokenizer.from_file(text_dir / "tokenizer.json", "0" * 64)
    assert info.value.reason == "TOKENIZER_HASH"


def test_template_pin_mismatch_is_a_specific_error(text_dir: Path):
    with pytest.raises(TemplateHashMismatch) as info:
        ChatTemplate.from_tokenizer_config(text_dir / "tokenizer_config.json", "f" * 64)
    assert info.value.reason == "TEMPLATE_HASH"


def test_non_byte_level_tokenizer_is_refused(text_dir: Path, tmp_path: Path):
    data = json.loads((text_dir / "tokenizer.json").read_text())
    data["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                       "split": True}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(UnsupportedTokenizer, match="not ByteLevel"):
        ProjectTokenizer.from_file(tmp_path / "tokenizer.json")


def test_chatml_rendering(text_context: TextContext):
    text = text_context.template.render([ChatMessage("system", "be brief"),
                                         ChatMessage("user", "hi")])
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_template_is_sandboxed(text_dir: Path, tmp_path: Path):
    shutil.copy(text_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    template = ChatTemplate.from_tokenizer_config(tmp_path / "tokenizer_config.json")
    with pytest.raises(TemplateError):
        template.render([ChatMessage("user", "x")])


def test_template_raise_exception_becomes_template_error(text_dir: Path, tmp_path: Path):
    source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    template = ChatTemplate.from_tokenizer_config(tmp_path / "tokenizer_config.json")
    with pytest.raises(TemplateError, match="user first"):
        template.render([ChatMessage("assistant", "x")])


def test_chat_template_jinja_file_wins_and_is_pinned_by_its_bytes(text_dir: Path, tmp_path: Path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(text_dir / name, tmp_path / name)
    source = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(source, encoding="utf-8")
    ctx = TextContext.from_checkpoint(tmp_path)
    assert ctx.identity.template_sha256 == sha256_hex(source.encode())
    assert ctx.template.render([ChatMessage("user", "hi")]) == "[user] hi\n"
    with pytest.raises(TemplateHashMismatch):
        TextContext.from_checkpoint(tmp_path, TextPins(template_sha256="0" * 64))


def test_rendering_matches_transformers_apply_chat_template(text_dir: Path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(text_dir / "tokenizer.json"))
    config = json.loads((text_dir / "tokenizer_config.json").read_text())
    hf.chat_template = config["chat_template"]
    conversation = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": "héllo 🙂"},
                    {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    ours = TextContext.from_checkpoint(text_dir).template.render(
        [ChatMessage(m["role"], m["content"]) for m in conversation])
    assert ours == hf.apply_chat_template(conversation, tokenize=False,
                                          add_generation_prompt=True)
