"""Shared MAX fixtures. Every test here uses the tiny-lora-yarn preset, so one set of four
compiled graphs (cached in the fixed MAX cache dir) serves the whole area."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("max")

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint  # noqa: E402
from libs.model.config import load_config  # noqa: E402
from libs.model.kernels import make_kernels  # noqa: E402
from libs.model.max_kernels import configure_max_process, default_cache_dir  # noqa: E402
from libs.model.weights import load_stage_weights  # noqa: E402

# A test run is a MAX process entry point: its compiled graphs go to the one Fornax cache.
configure_max_process(os.environ, default_cache_dir(os.environ))

PRESET = "tiny-lora-yarn"
SEED = 2  # the same checkpoint the model parity tests use; graphs depend only on the config


@pytest.fixture(scope="session")
def max_checkpoint(tmp_path_factory):
    return write_checkpoint(CheckpointRequest(PRESET, tmp_path_factory.mktemp("max_ck"), seed=SEED)).out_dir


@pytest.fixture(scope="session")
def full_stage(max_checkpoint):
    cfg = load_config(max_checkpoint)
    weights = load_stage_weights(max_checkpoint, cfg, 0, cfg.num_hidden_layers, first=True, last=True)
    return cfg, weights


@pytest.fixture(scope="session")
def numpy_kernels(full_stage):
    cfg, weights = full_stage
    return make_kernels("numpy", cfg, weights)


@pytest.fixture(scope="session")
def max_kernels(full_stage):
    cfg, weights = full_stage
    return make_kernels("max", cfg, weights, "cpu")
