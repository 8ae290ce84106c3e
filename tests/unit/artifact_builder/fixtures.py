"""A small DeepSeek-V2-layout checkpoint writer for artifact builder tests.

Writes deterministic random tensors with the reference safetensors writer, so the builder's own
header reader and writer are checked against an implementation they do not share.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from libs.model.config import parse_config
from libs.model.layout import expected_tensors

TINY_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "moe_intermediate_size": 8,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "kv_lora_rank": 8,
    "q_lora_rank": None,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "v_head_dim": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def write_checkpoint(
    root: Path,
    *,
    tied: bool = False,
    shards: int = 2,
    seed: int = 0,
    edit: Callable[[dict[str, np.ndarray]], None] | None = None,
    **overrides,
) -> Path:
    """Write config, tokenizer files and `shards` safetensors shards (+ index when > 1).

    `edit` may change, add or delete tensors before they are written (malformed checkpoints).
    """
    root.mkdir(parents=True, exist_ok=True)
    raw = dict(TINY_CONFIG, tie_word_embeddings=tied, **overrides)
    (root / "config.json").write_text(json.dumps(raw, indent=2))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    specs = expected_tensors(parse_config(raw), "F32")
    rng = np.random.default_rng(seed)
    tensors = {name: rng.standard_normal(spec.shape).astype(np.float32) for name, spec in specs.items()}
    if edit is not None:
        edit(tensors)
    names = list(tensors)
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"))
        return root
    weight_map = {}
    for i, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({names[j]: tensors[names[j]] for j in part}, str(root / shard))
        weight_map.update({names[j]: shard for j in part})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return root


def read_index(root: Path) -> dict:
    return json.loads((root / "model.safetensors.index.json").read_text())


def write_index(root: Path, index: dict) -> None:
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
