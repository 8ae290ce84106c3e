import json
import math

import pytest

from libs.model.config import parse_config
from libs.model.errors import ConfigError
from libs.model.layout import expected_tensors, layer_tensors
from services.planner.model import describe_checkpoint, describe_config
from tests.unit.planner.factories import synthetic_config


def _numel(shape):
    return math.prod(shape)


@pytest.mark.parametrize("q_lora", [None, 96])
def test_layer_bytes_match_the_checkpoint_tensor_layout(q_lora):
    raw = synthetic_config(5, experts=8, top_k=2, hidden=256, moe_intermediate=64, vocab=512, dense_layers=2)
    raw["q_lora_rank"] = q_lora
    model = describe_config(raw, snapshot="sha256:x")
    cfg = parse_config(raw)
    for layer in model.layers:
        params = sum(_numel(s) for s in layer_tensors(cfg, layer.index).values())
        assert layer.weight_bytes == 2 * params
        assert layer.is_moe == (layer.index >= 2)
    total = sum(_numel(spec.shape) for spec in expected_tensors(cfg).values())
    assert model.total_weight_bytes == 2 * total


def test_moe_active_bytes_count_only_top_k_routed_experts():
    raw = synthetic_config(3, experts=64, top_k=6, hidden=256, moe_intermediate=64, vocab=512, dense_layers=1, shared=2)
    model = describe_config(raw, snapshot="sha256:x")
    moe = model.layers[1]
    expert = 3 * 256 * 64 * 2
    assert model.expert_bytes == expert
    assert moe.weight_bytes - moe.dense_weight_bytes == 64 * expert
    active = moe.active_weight_bytes_per_token(model.expert_bytes, model.experts_per_token)
    assert active == moe.dense_weight_bytes + 6 * expert
    dense = model.layers[0]
    assert dense.active_weight_bytes_per_token(model.expert_bytes, 6) == dense.weight_bytes


def test_kv_bytes_are_mla_latent_plus_rope_key():
    raw = synthetic_config(2, experts=4, top_k=2, hidden=2048)  # kv_lora 512, rope 64
    model = describe_config(raw, snapshot="sha256:x")
    assert all(x.kv_bytes_per_token == (512 + 64) * 2 for x in model.layers)
    raw["dtype"] = "float32"
    assert describe_config(raw, snapshot="sha256:x").layers[0].kv_bytes_per_token == (512 + 64) * 4


def test_lite_shape_totals_about_sixteen_billion_parameters():
    model = describe_config(synthetic_config(27, experts=64, top_k=6), snapshot="sha256:x")
    params = model.total_weight_bytes / 2
    assert 15.5e9 < params < 16.0e9  # DeepSeek-V2-Lite is 15.7B parameters


def test_yarn_rope_requires_its_operation_and_bad_dtype_is_refused():
    raw = synthetic_config(2, experts=4, top_k=2, hidden=256)
    raw["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    assert "rope_yarn" in describe_config(raw, snapshot="s").required_operations
    raw["dtype"] = "int8"
    with pytest.raises(ConfigError):
        describe_config(raw, snapshot="s")


def test_checkpoint_snapshot_hashes_config(tmp_path):
    raw = synthetic_config(2, experts=4, top_k=2, hidden=256)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    first = describe_checkpoint(tmp_path)
    assert first.model_snapshot.startswith("sha256:") and len(first.model_snapshot) == 71
    raw["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(raw))
    second = describe_checkpoint(tmp_path)
    assert second.model_snapshot != first.model_snapshot and second.num_layers == 3
    with pytest.raises(ConfigError):
        describe_checkpoint(tmp_path / "missing")


def test_the_kv_dtype_sets_the_memory_term():
    raw = synthetic_config(2, experts=4, top_k=2, hidden=2048)  # kv_lora 512, rope 64
    assert describe_config(raw, "sha256:x", kv_dtype="fp32").layers[0].kv_bytes_per_token == (512 + 64) * 4
    assert describe_config(raw, "sha256:x", kv_dtype="bf16").layers[0].kv_bytes_per_token == (512 + 64) * 2
    with pytest.raises(ConfigError) as err:
        describe_config(raw, "sha256:x", kv_dtype="fp4")
    assert err.value.reason == "KV_DTYPE"
