"""deepseek2 GGUF files written from a generated checkpoint with `gguf.GGUFWriter`, for tests that
must run without llama.cpp: the metadata keys and tensor layout its converter writes (merged
experts, kv_b_proj split into attn_k_b (transposed) + attn_v_b, or the older single attn_kv_b),
each tensor in the GGUF type `types(name, shape)` picks, encoded by the project's codecs.

`write_gguf` also returns each Hugging Face tensor as the file holds it, decoded (the dequantized
reference), worked out from the Hugging Face side only, so a reader's mapping is checked against
values it did not produce.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from libs.model.config import load_config
from libs.model.layout import EMBED, FINAL_NORM, LM_HEAD, expected_tensors
from libs.model.safetensors_io import SafetensorsWriter
from libs.model.weights import read_bf16_aware
from libs.weights.codecs import decode, encode
from libs.weights.formats import BY_GGUF_TYPE

TypeChoice = Callable[[str, tuple[int, ...]], str]
_GLOBAL = {EMBED: "token_embd.weight", FINAL_NORM: "output_norm.weight", LM_HEAD: "output.weight"}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


def llama_like_types(name: str, shape: tuple[int, ...]) -> str:
    """1-D tensors and the router F32; rows that fit 32-blocks Q8_0; the rest F16."""
    if len(shape) == 1 or name.startswith("ffn_gate_inp") or ".ffn_gate_inp" in name:
        return "F32"
    return "Q8_0" if shape[-1] % 32 == 0 else "F16"


def f32_types(name: str, shape: tuple[int, ...]) -> str:
    return "F32"


_MIXED = {"attn_q.": "Q4_0", "attn_output.": "Q5_1", "_exps.": "Q5_0", "_shexp.": "BF16", "token_embd.": "Q8_0",
          "output.": "F16", "attn_kv_a_mqa.": "BF16", "ffn_gate.": "Q4_0", "ffn_up.": "Q5_1", "ffn_down.": "Q8_0"}


def mixed_types(name: str, shape: tuple[int, ...]) -> str:
    """Every non-K type a tiny model's rows fit, spread over its tensors (tiny has no 256-long row)."""
    wanted = next((t for key, t in _MIXED.items() if key in name), "F32")
    if len(shape) == 1 or ".ffn_gate_inp" in name or (wanted not in ("F16", "BF16") and shape[-1] % 32):
        return "F32" if len(shape) == 1 or ".ffn_gate_inp" in name else "F16"
    return wanted


def _stored(values: np.ndarray, gguf_type: str) -> tuple[np.ndarray, np.ndarray]:
    """(the array GGUFWriter stores, its decoded float32 values)."""
    fmt = BY_GGUF_TYPE[gguf_type]
    stored = encode(values, fmt)
    return stored, np.asarray(decode(stored, fmt), np.float32).reshape(values.shape)


def write_gguf(checkpoint: Path, out: Path, types: TypeChoice = f32_types, split_kv_b: bool = True,
               metadata_edits: dict | None = None, drop_keys: tuple[str, ...] = (),
               arch: str = "deepseek2") -> dict[str, np.ndarray]:
    """Writes the GGUF; returns {Hugging Face name: float32 values the file holds}."""
    from gguf import GGMLQuantizationType, GGUFWriter

    cfg = load_config(checkpoint)
    raw = json.loads((checkpoint / "config.json").read_text())
    hf = read_bf16_aware(checkpoint, list(expected_tensors(cfg)))
    writer = GGUFWriter(str(out), arch)
    _metadata(writer, checkpoint, raw, split_kv_b, metadata_edits or {}, drop_keys, arch)
    reference: dict[str, np.ndarray] = {}

    def put(gguf_name: str, values: np.ndarray) -> np.ndarray:
        gguf_type = types(gguf_name, tuple(values.shape))
        stored, held = _stored(values, gguf_type)
        if gguf_type in ("F32", "F16"):
            writer.add_tensor(gguf_name, stored)
        else:  # raw bytes: the writer derives the logical shape from the type's block
            writer.add_tensor(gguf_name, stored.view(np.uint8), raw_dtype=GGMLQuantizationType[gguf_type])
        return held

    for name, gguf_name in _GLOBAL.items():
        if name in hf:
            reference[name] = put(gguf_name, hf[name])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf_rest, gguf_rest in _LAYER.items():
            if p + hf_rest not in hf or (split_kv_b and hf_rest.endswith("kv_b_proj.weight")):
                continue
            reference[p + hf_rest] = put(f"blk.{i}.{gguf_rest}", hf[p + hf_rest])
        if split_kv_b:
            kv_b = hf[p + "self_attn.kv_b_proj.weight"].reshape(cfg.num_attention_heads, -1, cfg.kv_lora_rank)
            k_b = np.ascontiguousarray(np.swapaxes(kv_b[:, :cfg.qk_nope_head_dim], 1, 2))
            v_b = np.ascontiguousarray(kv_b[:, cfg.qk_nope_head_dim:])
            k_held, v_held = put(f"blk.{i}.attn_k_b.weight", k_b), put(f"blk.{i}.attn_v_b.weight", v_b)
            reference[p + "self_attn.kv_b_proj.weight"] = np.concatenate(
                [np.swapaxes(k_held, 1, 2), v_held], axis=1).reshape(-1, cfg.kv_lora_rank)
        if cfg.is_moe_layer(i):
            for proj, gguf_rest in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                                    ("down_proj", "ffn_down_exps")):
                stacked = np.stack([hf[f"{p}mlp.experts.{e}.{proj}.weight"] for e in range(cfg.n_routed_experts)])
                held = put(f"blk.{i}.{gguf_rest}.weight", stacked)
                for e in range(cfg.n_routed_experts):
                    reference[f"{p}mlp.experts.{e}.{proj}.weight"] = held[e]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return reference


def _metadata(writer, checkpoint: Path, raw: dict, split_kv_b: bool, edits: dict, drop: tuple[str, ...],
              arch: str) -> None:
    nope, rope, v = raw["qk_nope_head_dim"], raw["qk_rope_head_dim"], raw["v_head_dim"]
    keys: dict[str, object] = {
        "block_count": raw["num_hidden_layers"], "context_length": raw["max_position_embeddings"],
        "embedding_length": raw["hidden_size"], "feed_forward_length": raw["intermediate_size"],
        "attention.head_count": raw["num_attention_heads"], "rope.freq_base": float(raw["rope_theta"]),
        "attention.layer_norm_rms_epsilon": float(raw["rms_norm_eps"]), "expert_count": raw["n_routed_experts"],
        "expert_used_count": raw["num_experts_per_tok"], "leading_dense_block_count": raw["first_k_dense_replace"],
        "vocab_size": raw["vocab_size"], "attention.kv_lora_rank": raw["kv_lora_rank"],
        "expert_feed_forward_length": raw["moe_intermediate_size"], "expert_shared_count": raw["n_shared_experts"],
        "expert_weights_scale": float(raw["routed_scaling_factor"]), "rope.dimension_count": rope,
        "attention.q_lora_rank": raw["q_lora_rank"] or 0,
    }
    if split_kv_b:  # the current converter: MLA as MQA over the latent
        keys |= {"attention.head_count_kv": 1, "attention.key_length": raw["kv_lora_rank"] + rope,
                 "attention.value_length": raw["kv_lora_rank"], "attention.key_length_mla": nope + rope,
                 "attention.value_length_mla": v}
    else:
        keys |= {"attention.head_count_kv": raw["num_attention_heads"], "attention.key_length": nope + rope,
                 "attention.value_length": v}
    keys |= edits
    for key, value in keys.items():
        if key in drop:
            continue
        full = f"{arch}.{key}"
        if isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_uint32(full, int(value))
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {a["content"] for a in tokenizer["added_tokens"] if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    template = json.loads((checkpoint / "tokenizer_config.json").read_text())["chat_template"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(raw["bos_token_id"])
    writer.add_eos_token_id(raw["eos_token_id"])
    writer.add_pad_token_id(raw["bos_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(template)


def write_reference_checkpoint(checkpoint: Path, reference: dict[str, np.ndarray], out: Path) -> Path:
    """A float32 Hugging Face checkpoint of `reference` beside `checkpoint`'s config and tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads((checkpoint / "config.json").read_text()) | {"torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((checkpoint / name).read_bytes())
    names = sorted(reference)
    writer = SafetensorsWriter(out / "model.safetensors", [(n, "F32", reference[n].shape) for n in names],
                               {"format": "pt"})
    for name in names:
        writer.write(name, reference[name])
    writer.close()
    return out


def dequantized_from_gguf(path: Path) -> dict[str, np.ndarray]:
    """{Hugging Face name: float32 values} of any deepseek2 GGUF (llama.cpp's own files), decoded
    through the reader's mapping; the mapping itself is checked by the f32 file's exact logits."""
    from libs.model.gguf_source import compose_kv_b
    from services.artifact_builder.encode_weights import read_rows
    from services.artifact_builder.snapshot import inspect_checkpoint

    out: dict[str, np.ndarray] = {}
    with open(path, "rb") as fh:
        for t in inspect_checkpoint(path).tensors:
            if t.parts:
                k_b, v_b = (read_rows(fh, p, 0, int(np.prod(p.shape[:-1]))).reshape(p.shape) for p in t.parts)
                out[t.name] = compose_kv_b(k_b, v_b)
            else:
                rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
                out[t.name] = read_rows(fh, t, 0, rows).reshape(t.shape)
    return out
