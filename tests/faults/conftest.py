from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.orchestrator.harness import tiny_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
