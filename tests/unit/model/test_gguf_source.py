"""The GGUF-to-Hugging-Face mapping's pure parts: names and byte ranges, kv_b_proj reassembly,
config from metadata, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.config import parse_config
from libs.model.gguf_source import (
    GgufTensor,
    compose_kv_b,
    config_from_metadata,
    map_tensors,
)
from libs.model.gguf_tokenizer import tokenizer_json
from libs.model.presets import PRESETS
from libs.service.errors import FornaxError

LITE_LIKE = {
    "general.architecture": "deepseek2", "deepseek2.block_count": 27, "deepseek2.context_length": 163840,
    "deepseek2.embedding_length": 2048, "deepseek2.feed_forward_length": 10944,
    "deepseek2.attention.head_count": 16, "deepseek2.attention.head_count_kv": 1,
    "deepseek2.rope.freq_base": 10000.0, "deepseek2.attention.layer_norm_rms_epsilon": 1e-6,
    "deepseek2.expert_count": 64, "deepseek2.expert_used_count": 6, "deepseek2.attention.key_length": 576,
    "deepseek2.attention.value_length": 512, "deepseek2.attention.key_length_mla": 192,
    "deepseek2.attention.value_length_mla": 128, "deepseek2.leading_dense_block_count": 1,
    "deepseek2.vocab_size": 102400, "deepseek2.attention.kv_lora_rank": 512,
    "deepseek2.expert_feed_forward_length": 1408, "deepseek2.expert_shared_count": 2,
    "deepseek2.expert_weights_scale": 1.0, "deepseek2.rope.dimension_count": 64,
    "deepseek2.rope.scaling.type": "yarn", "deepseek2.rope.scaling.factor": 40.0,
    "deepseek2.rope.scaling.original_context_length": 4096,
    "deepseek2.rope.scaling.yarn_log_multiplier": 0.0707,
    "tokenizer.ggml.bos_token_id": 100000, "tokenizer.ggml.eos_token_id": 100001,
}


def test_lite_metadata_gives_lites_config():
    raw = config_from_metadata(LITE_LIKE, {"output.weight"})
    cfg = parse_config(raw)
    lite = PRESETS["lite"]
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "kv_lora_rank",
                "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                "n_shared_experts", "first_k_dense_replace", "vocab_size", "max_position_embeddings"):
        assert raw[key] == lite[key], key
    assert cfg.q_lora_rank is None and not cfg.tie_word_embeddings
    assert cfg.rope.rope_type == "yarn" and cfg.rope.factor == 40.0
    assert cfg.rope.original_max_position_embeddings == 4096
    assert cfg.rope.mscale == cfg.rope.mscale_all_dim == pytest.approx(0.707)


def test_an_older_file_reads_per_head_key_and_value_lengths():
    older = {k: v for k, v in LITE_LIKE.items() if "_mla" not in k}
    older |= {"deepseek2.attention.key_length": 192, "deepseek2.attention.value_length": 128}
    raw = config_from_metadata(older, set())
    assert (raw["qk_nope_head_dim"], raw["v_head_dim"], raw["tie_word_embeddings"]) == (128, 128, True)


def test_expert_groups_mean_group_limited_routing():
    raw = config_from_metadata(LITE_LIKE | {"deepseek2.expert_group_count": 8,
                                            "deepseek2.expert_group_used_count": 3}, set())
    assert (raw["topk_method"], raw["n_group"], raw["topk_group"]) == ("group_limited_greedy", 8, 3)
    one = config_from_metadata(LITE_LIKE | {"deepseek2.expert_group_count": 1}, set())
    assert one["topk_method"] == "greedy"


@pytest.mark.parametrize("edit, reason, named", [
    ({"deepseek2.rope.scaling.type": "linear"}, "GGUF_METADATA_INVALID", "rope.scaling.type"),
    ({"deepseek2.attention.kv_lora_rank": -1}, "GGUF_METADATA_INVALID", "kv_lora_rank"),
    ({"deepseek2.expert_count": "many"}, "GGUF_METADATA_INVALID", "expert_count"),
    ({"general.architecture": "qwen2"}, "GGUF_ARCHITECTURE_UNSUPPORTED", "qwen2"),
])
def test_bad_metadata_is_refused_naming_the_key(edit, reason, named):
    with pytest.raises(FornaxError) as caught:
        config_from_metadata(LITE_LIKE | edit, set())
    assert caught.value.reason == reason and named in caught.value.message


def test_merged_experts_become_per_expert_byte_ranges():
    merged = GgufTensor("blk.1.ffn_down_exps.weight", "Q8_0", (8, 64, 34), 1000, 8 * 64 * 34)
    mapped = map_tensors([merged], PRESETS["tiny"])
    assert [m.name for m in mapped] == [f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(8)]
    assert [m.offset for m in mapped] == [1000 + e * 64 * 34 for e in range(8)]
    assert {(m.shape, m.nbytes, m.gguf_type) for m in mapped} == {((64, 34), 64 * 34, "Q8_0")}


def test_split_kv_b_is_recomposed_exactly_as_the_converter_split_it():
    heads, nope, v, rank = 4, 16, 16, 32
    kv_b = np.random.default_rng(0).standard_normal((heads * (nope + v), rank), dtype=np.float32)
    per_head = kv_b.reshape(heads, nope + v, rank)
    k_b, v_b = np.swapaxes(per_head[:, :nope], 1, 2), per_head[:, nope:]  # what the converter writes
    np.testing.assert_array_equal(compose_kv_b(k_b, v_b), kv_b)
    parts = [GgufTensor("blk.0.attn_k_b.weight", "F16", (heads, rank, nope), 0, 0),
             GgufTensor("blk.0.attn_v_b.weight", "Q8_0", (heads, v, rank), 0, 0)]
    (mapped,) = map_tensors(parts, PRESETS["tiny"])
    assert mapped.name == "model.layers.0.self_attn.kv_b_proj.weight" and mapped.composed
    assert mapped.shape == (heads * (nope + v), rank) and mapped.gguf_type == "F32"
    with pytest.raises(FornaxError) as caught:
        map_tensors(parts[:1], PRESETS["tiny"])
    assert caught.value.reason == "GGUF_TENSOR_MISSING" and "attn_v_b" in caught.value.message


def test_a_tensor_no_deepseek2_has_is_refused_by_name():
    with pytest.raises(FornaxError) as caught:
        map_tensors([GgufTensor("blk.3.exp_probs_b.bias", "F32", (8,), 0, 32)], PRESETS["tiny"])
    assert caught.value.reason == "GGUF_TENSOR_UNEXPECTED" and "blk.3.exp_probs_b.bias" in caught.value.message


def test_another_pre_tokenizer_is_refused_by_name():
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-llm", "tokenizer.ggml.tokens": ["a"],
                "tokenizer.ggml.merges": []}
    with pytest.raises(FornaxError) as caught:
        tokenizer_json(metadata)
    assert caught.value.reason == "GGUF_TOKENIZER_UNSUPPORTED" and "deepseek-llm" in caught.value.message


def test_a_gguf_is_planned_as_the_policy_nearest_its_stored_bits(tmp_path):
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
    from services.orchestrator.route.install import gguf_planning_policy
    from tests.support.gguf_files import f32_types, llama_like_types, write_gguf

    write_checkpoint(CheckpointRequest("tiny", tmp_path / "ck"))
    write_gguf(tmp_path / "ck", tmp_path / "f32.gguf", f32_types)
    write_gguf(tmp_path / "ck", tmp_path / "q8.gguf", llama_like_types)
    assert gguf_planning_policy(str(tmp_path / "f32.gguf")) == (None, 32.0)
    policy, bits = gguf_planning_policy(str(tmp_path / "q8.gguf"))
    assert policy == "q8_0" and 8.5 < bits < 12


def test_the_planner_describes_a_gguf_from_its_metadata_and_stored_bits(tmp_path):
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
    from services.planner.model import describe_checkpoint
    from tests.support.gguf_files import llama_like_types, write_gguf

    write_checkpoint(CheckpointRequest("tiny", tmp_path / "ck"))
    write_gguf(tmp_path / "ck", tmp_path / "q8.gguf", llama_like_types)
    from_gguf = describe_checkpoint(tmp_path / "q8.gguf")
    as_q8 = describe_checkpoint(tmp_path / "ck", "q8_0")
    assert from_gguf.weights_policy == "q8_0" and from_gguf.layers == as_q8.layers
    assert from_gguf.model_snapshot != as_q8.model_snapshot  # the derived config, not the checkpoint's
