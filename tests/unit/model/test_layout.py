"""The tensor layout matches what Hugging Face's own DeepseekV2ForCausalLM saves."""

from __future__ import annotations

import pytest

from libs.model.config import parse_config
from libs.model.layout import EMBED, FINAL_NORM, LM_HEAD, expected_tensors, tensors_for_layers

BASE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 2, "kv_lora_rank": 8, "q_lora_rank": None,
    "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
}


def hf_saved_layout(raw: dict, tmp_path) -> dict[str, tuple[int, ...]]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    keys = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**keys))
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as handle:
        return {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"q_lora_rank": 12}, {"tie_word_embeddings": True}, {"first_k_dense_replace": 0, "n_shared_experts": 2}],
)
def test_expected_tensors_match_transformers_save(overrides, tmp_path):
    raw = {**BASE, **overrides}
    saved = hf_saved_layout(raw, tmp_path)
    ours = {name: spec.shape for name, spec in expected_tensors(parse_config(raw)).items()}
    assert ours == saved


def test_tensors_for_layers_partitions_every_tensor_once():
    cfg = parse_config(BASE)
    parts = [
        tensors_for_layers(cfg, 0, 1, first=True, last=False),
        tensors_for_layers(cfg, 1, 2, first=False, last=False),
        tensors_for_layers(cfg, 2, 3, first=False, last=True),
    ]
    flat = [n for part in parts for n in part]
    assert sorted(flat) == sorted(expected_tensors(cfg))
    assert EMBED in parts[0] and FINAL_NORM in parts[2] and LM_HEAD in parts[2]
    assert all(n.startswith("model.layers.1.") for n in parts[1])


def test_tied_last_stage_gets_embeddings_as_head():
    cfg = parse_config({**BASE, "tie_word_embeddings": True})
    last = tensors_for_layers(cfg, 2, 3, first=False, last=True)
    assert EMBED in last and LM_HEAD not in last
    single = tensors_for_layers(cfg, 0, 3, first=True, last=True)
    assert single.count(EMBED) == 1


def test_layer_range_outside_model_is_rejected():
    with pytest.raises(ValueError):
        tensors_for_layers(parse_config(BASE), 2, 4, first=False, last=True)
