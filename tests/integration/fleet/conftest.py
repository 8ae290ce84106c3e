"""The fleet tests' tiny checkpoint, one per module (a module may define its own `checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.orchestrator.harness import tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
