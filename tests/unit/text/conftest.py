from __future__ import annotations

from pathlib import Path

import pytest

from libs.text.context import TextContext
from tests.unit.text.fixtures import write_text_checkpoint


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_checkpoint(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="session")
def text_context(text_dir: Path) -> TextContext:
    return TextContext.from_checkpoint(text_dir)


PROJECT_ASSETS = Path(__file__).resolve().parents[3] / "libs" / "model" / "assets"


@pytest.fixture(scope="session", params=["fixture", "project"])
def any_text_context(request: pytest.FixtureRequest, text_context: TextContext) -> TextContext:
    """The tiny trained fixture tokenizer and the project's committed tokenizer."""
    if request.param == "fixture":
        return text_context
    return TextContext.from_checkpoint(PROJECT_ASSETS)
