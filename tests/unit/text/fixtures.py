"""A tiny byte-level BPE tokenizer and ChatML template, trained on the fly for tests."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Mixed scripts so that merges produce tokens that end inside multi-byte UTF-8 sequences.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Fornax serves a sparse mixture of experts across heterogeneous machines.",
    "naïve café résumé déjà vu — “quotes” ‘single’ … ellipsis",
    "日本語のテキストと中文文本，以及한국어 텍스트。",
    "emoji 🙂🚀🔥 and flags 🇫🇷🇯🇵 and zwj 👩‍💻 sequences",
    "Ελληνικά κείμενα και русский текст и עברית",
    "def f(x):\n    return x * 2  # code\n\ttabs",
]


@lru_cache(maxsize=1)
def _trained_json() -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tokenizer.to_str()


def write_text_checkpoint(root: Path, template: str = CHATML_TEMPLATE) -> Path:
    """Writes tokenizer.json, tokenizer_config.json and a minimal config.json into root."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(_trained_json(), encoding="utf-8")
    (root / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": template, "eos_token": "<|im_end|>", "bos_token": None,
    }), encoding="utf-8")
    return root
