"""Which reference qualify uses: `auto` picks the streamed one exactly when the whole float32
model plus its margin exceeds the memory available; an explicit choice stands."""

from __future__ import annotations

import pytest

from apps.qualify.reference_choice import (
    AUTO,
    FIXED_MARGIN_BYTES,
    STREAMED,
    WHOLE,
    choose_reference,
    whole_reference_bytes,
)

GIB = 2**30
LITE_F32_BYTES = 63 * 10**9  # DeepSeek-V2-Lite as float32
BOX_AVAILABLE = 20 * GIB


def test_auto_streams_when_the_float32_model_exceeds_the_memory_available():
    choice = choose_reference(AUTO, LITE_F32_BYTES, BOX_AVAILABLE)
    assert choice.kind == STREAMED
    assert "exceeds" in choice.describe() and str(LITE_F32_BYTES) in choice.describe()
    assert str(BOX_AVAILABLE) in choice.describe()


def test_auto_keeps_the_whole_model_when_it_fits():
    choice = choose_reference(AUTO, 1_417_984, BOX_AVAILABLE)
    assert choice.kind == WHOLE and "fits in" in choice.describe()


def test_the_margin_counts_a_model_that_alone_would_fit_is_streamed():
    model = 16 * GIB
    assert model < BOX_AVAILABLE < whole_reference_bytes(model)
    assert choose_reference(AUTO, model, BOX_AVAILABLE).kind == STREAMED


def test_auto_at_the_boundary_keeps_the_whole_model():
    model = 8 * GIB
    needed = whole_reference_bytes(model)
    assert needed > model + FIXED_MARGIN_BYTES
    assert choose_reference(AUTO, model, needed).kind == WHOLE
    assert choose_reference(AUTO, model, needed - 1).kind == STREAMED


@pytest.mark.parametrize("requested", [WHOLE, STREAMED])
def test_an_explicit_reference_stands_whatever_the_memory(requested):
    choice = choose_reference(requested, LITE_F32_BYTES if requested == WHOLE else 1, 0)
    assert choice.kind == requested and f"--reference {requested}" in choice.describe()


def test_an_unknown_reference_is_refused_by_name():
    with pytest.raises(ValueError, match="whole, streamed, auto"):
        choose_reference("partial", 1, 1)
