"""Stage weight loading reads only the stage's own tensors, as float32."""

from __future__ import annotations

import json

import numpy as np
import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.errors import CheckpointError
from libs.model.layout import tensors_for_layers
from libs.model.weights import INDEX_NAME, load_stage_weights


def test_middle_stage_loads_without_other_shards(tmp_path):
    write_checkpoint(CheckpointRequest("tiny", tmp_path, max_shard_bytes=32 * 1024))
    cfg = load_config(tmp_path)
    weight_map = json.loads((tmp_path / INDEX_NAME).read_text())["weight_map"]
    needed = {weight_map[n] for n in tensors_for_layers(cfg, 2, 3, first=False, last=False)}
    removed = set(weight_map.values()) - needed
    assert removed
    for shard in removed:
        (tmp_path / shard).unlink()
    stage = load_stage_weights(tmp_path, cfg, 2, 3, first=False, last=False)
    assert stage.embed is None and stage.lm_head is None and set(stage.layers) == {2}
    moe = stage.layer(2).moe
    assert moe.experts_gate.shape == (8, 32, 64) and moe.experts_gate.dtype == np.float32
    with pytest.raises(CheckpointError):
        stage.layer(1)
    with pytest.raises(CheckpointError):
        load_stage_weights(tmp_path, cfg, 0, 1, first=True, last=False)


def test_tied_last_stage_uses_embeddings_as_head(variant_checkpoint):
    cfg = load_config(variant_checkpoint)
    stage = load_stage_weights(variant_checkpoint, cfg, 3, 4, first=False, last=True)
    assert stage.lm_head is not None and stage.lm_head.shape == (cfg.vocab_size, cfg.hidden_size)
    first = load_stage_weights(variant_checkpoint, cfg, 0, 1, first=True, last=False)
    np.testing.assert_array_equal(stage.lm_head, first.embed)
    assert stage.layer(3).attention.q_proj is None and stage.layer(3).attention.q_b_proj is not None


def test_corrupt_or_missing_tensors_fail_closed(tmp_path):
    write_checkpoint(CheckpointRequest("tiny", tmp_path))
    cfg = load_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(CheckpointError):
        load_stage_weights(tmp_path, cfg, 0, 1, first=True, last=False)
