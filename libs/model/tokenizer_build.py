"""The project's byte-level BPE tokenizer: trained deterministically on a committed corpus.

The trained files are committed under `assets/`; `fornax model build-tokenizer` retrains
them, and a test checks that retraining reproduces the committed bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
CORPUS = ASSETS / "tokenizer_corpus.txt"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"
TARGET_VOCAB = 512
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
# ChatML with Hermes-style tools: definitions in the system turn, calls as <tool_call> JSON,
# results as <tool_response> in a user turn (the shape Qwen2.5 and Hermes checkpoints use).
CHATML_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call functions. Function signatures are within <tools></tools>:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments'"
    " + ' within <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>,'"
    " + ' \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>\\n{\"name\":' + (call['function']['name'] | tojson) + ',\"arguments\":'"
    " + call['function']['arguments'] + '}\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer_json(corpus_text: str) -> str:
    """Train the byte-level BPE and return its serialized tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in corpus_text.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer.to_str(pretty=True)


def tokenizer_config_json() -> str:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": BOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML_TEMPLATE,
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def build_assets(out_dir: Path = ASSETS) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TOKENIZER_JSON).write_text(train_tokenizer_json(CORPUS.read_text()) + "\n")
    (out_dir / TOKENIZER_CONFIG_JSON).write_text(tokenizer_config_json())


def tokenizer_vocab_size(path: Path = ASSETS / TOKENIZER_JSON) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)


def special_token_id(token: str, path: Path = ASSETS / TOKENIZER_JSON) -> int:
    from tokenizers import Tokenizer

    token_id = Tokenizer.from_file(str(path)).token_to_id(token)
    if token_id is None:
        raise KeyError(token)
    return int(token_id)
