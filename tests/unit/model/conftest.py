from __future__ import annotations

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    return write_checkpoint(CheckpointRequest("tiny", tmp_path_factory.mktemp("tiny"), seed=1)).out_dir


@pytest.fixture(scope="session")
def variant_checkpoint(tmp_path_factory):
    return write_checkpoint(CheckpointRequest("tiny-lora-yarn", tmp_path_factory.mktemp("variant"), seed=2)).out_dir
