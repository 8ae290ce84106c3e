"""Fixtures the stage-worker integration tests share: a tiny checkpoint and two live workers."""

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from tests.support.stages import start_workers


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(CheckpointRequest("tiny", tmp_path_factory.mktemp("ckpt"), seed=3)).out_dir


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """Two stage-worker processes, fresh for each test module."""
    fleet = start_workers(2, tmp_path_factory.mktemp("two"))
    yield fleet
    fleet.stop()
