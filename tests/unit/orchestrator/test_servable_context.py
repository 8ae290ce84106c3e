"""/v1/models max_model_len: min(model positions, the smallest stage KV capacity for one sequence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import DeepseekV2Config, load_config
from libs.model.kv_blocks import KV_BLOCK_TOKENS
from services.orchestrator.api.openai_response import model_object
from services.orchestrator.engine.domain import mla_kv_bytes_per_token
from services.orchestrator.engine.model_card import served_model


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> DeepseekV2Config:
    root: Path = tmp_path_factory.mktemp("tiny")
    write_checkpoint(CheckpointRequest("tiny", root))
    return load_config(str(root))


def test_a_roomy_route_serves_the_model_positions(cfg: DeepseekV2Config):
    served = served_model(cfg, [(0, 1), (1, 2)], "tiny", kv_budget_bytes=1 << 40)
    model = model_object(served, None)
    assert model["max_model_len"] == cfg.max_position_embeddings
    assert model["fornax"]["max_model_len_bound"] == "model positions"
    assert model["fornax"]["context_length"] == cfg.max_position_embeddings


def test_the_smallest_stage_kv_capacity_bounds_max_model_len(cfg: DeepseekV2Config):
    per_token = mla_kv_bytes_per_token(cfg.kv_lora_rank, cfg.qk_rope_head_dim, 1)
    blocks = 2
    assert blocks * KV_BLOCK_TOKENS < cfg.max_position_embeddings
    budgets = (1 << 40, blocks * KV_BLOCK_TOKENS * per_token + per_token)  # a partial block is no block
    served = served_model(cfg, [(0, 1), (1, 2)], "tiny", stage_kv_budgets=budgets)
    model = model_object(served, None)
    assert model["max_model_len"] == blocks * KV_BLOCK_TOKENS
    assert model["fornax"]["max_model_len_bound"] == "stage 1 KV"


def test_a_stage_reported_block_count_is_its_capacity(cfg: DeepseekV2Config):
    served = served_model(cfg, [(0, 1), (1, 2)], "tiny", kv_budget_bytes=1 << 40,
                          stage_kv_blocks=((KV_BLOCK_TOKENS, 3), (KV_BLOCK_TOKENS, None)))
    assert served.servable_context == (3 * KV_BLOCK_TOKENS, "stage 0 KV")
