"""A tied-embedding model split into artifacts: the last stage loads its explicit head copy."""

from __future__ import annotations

import numpy as np

from libs.common.kinds import DType
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.weights import load_stage_weights
from services.artifact_builder.build import BuildOptions, build_stage_artifacts
from services.artifact_builder.snapshot import inspect_checkpoint
from services.artifact_builder.staging import plan_from_ranges


def test_the_last_stage_of_a_tied_model_loads_from_its_artifact(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny-lora-yarn", tmp_path / "ckpt", seed=7)).out_dir
    cfg = load_config(checkpoint)
    assert cfg.tie_word_embeddings
    layers = cfg.num_hidden_layers
    events = list(build_stage_artifacts(inspect_checkpoint(checkpoint), plan_from_ranges(((0, 2), (2, layers))),
                                        BuildOptions(out_dir=tmp_path / "out", boundary_dtype=DType.FP32)))
    result = events[-1]
    last = next(s for s in result.stages if s.stage_index == 1)
    from_artifact = load_stage_weights(last.artifact_dir, cfg, 2, layers, first=False, last=True)
    from_checkpoint = load_stage_weights(checkpoint, cfg, 2, layers, first=False, last=True)
    np.testing.assert_array_equal(from_artifact.lm_head, from_checkpoint.lm_head)
    np.testing.assert_array_equal(from_artifact.final_norm, from_checkpoint.final_norm)
    assert from_artifact.embed is None
