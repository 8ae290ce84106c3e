"""A GGUF's `tokenizer.ggml.*` metadata as Hugging Face `tokenizer.json` and `tokenizer_config.json`.

Accepted: the `gpt2` tokenizer model (byte-level BPE: token strings in the byte-to-unicode
alphabet, merges as "left right") with the `gpt-2` pre-tokenizer, which is the split the
project's own tokenizer uses. Control tokens (token type 3) become special added tokens and
user-defined ones (type 4) plain added tokens; the
chat template is `tokenizer.chat_template`. Any other tokenizer model or pre-tokenizer is
refused by name: a different split would change every prompt's ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from libs.model.gguf_source import GgufMetadataError

TOKENIZER_MODELS = ("gpt2",)
PRE_TOKENIZERS = ("gpt-2",)
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL / _USER_DEFINED


class GgufTokenizerError(GgufMetadataError):
    default_reason = "GGUF_TOKENIZER_UNSUPPORTED"


def _required(metadata: Mapping[str, Any], key: str) -> Any:
    if key not in metadata:
        raise GgufMetadataError(f"GGUF metadata lacks {key}", reason="GGUF_METADATA_MISSING")
    return metadata[key]


def tokenizer_json(metadata: Mapping[str, Any]) -> str:
    """The tokenizer.json text (serialized by the `tokenizers` library, deterministic)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model, pre = _required(metadata, "tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre", "default")
    if model not in TOKENIZER_MODELS or pre not in PRE_TOKENIZERS:
        raise GgufTokenizerError(f"GGUF tokenizer {model!r} with pre-tokenizer {pre!r} is not supported "
                                 f"(supported: {'/'.join(TOKENIZER_MODELS)} with {'/'.join(PRE_TOKENIZERS)})")
    tokens = list(_required(metadata, "tokenizer.ggml.tokens"))
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _required(metadata, "tokenizer.ggml.merges")]
    if len(types) != len(tokens) or len(set(tokens)) != len(tokens) or any(len(m) != 2 for m in merges):
        raise GgufMetadataError("tokenizer.ggml.tokens / token_type / merges are inconsistent")
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [(tokens[i], kind == _CONTROL) for i, kind in enumerate(types) if kind in (_CONTROL, _USER_DEFINED)]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, special in added if not special])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, special in added if special])
    return tokenizer.to_str(pretty=True) + "\n"


def tokenizer_config_json(metadata: Mapping[str, Any]) -> str:
    tokens = list(_required(metadata, "tokenizer.ggml.tokens"))
    template = metadata.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template:
        raise GgufMetadataError("GGUF metadata lacks tokenizer.chat_template", reason="GGUF_METADATA_MISSING")

    def token(which: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{which}_token_id")
        if index is None:
            return None
        if not 0 <= int(index) < len(tokens):
            raise GgufMetadataError(f"tokenizer.ggml.{which}_token_id = {index} is outside the vocabulary")
        return tokens[int(index)]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": None,
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
