from __future__ import annotations

from pathlib import Path

import pytest

from libs.text.context import TextContext
from tests.unit.text.fixtures import write_text_checkpoint


@pytest.fixture(scope="session")
def text_context(tmp_path_factory: pytest.TempPathFactory) -> TextContext:
    return TextContext.from_checkpoint(write_text_checkpoint(tmp_path_factory.mktemp("text")))


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_checkpoint(tmp_path_factory.mktemp("text_dir"))
