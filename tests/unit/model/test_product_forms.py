"""The rule that picks a MAX linear product's form from the call's row count."""

from __future__ import annotations

from libs.model.product_forms import STREAMED_MAX_ROWS, streams_rows


def test_one_or_two_rows_stream_and_more_rows_batch():
    assert STREAMED_MAX_ROWS == 2
    assert [streams_rows(r) for r in (1, 2, 3, 8, 512)] == [True, True, False, False, False]


def test_no_rows_do_not_stream():
    assert not streams_rows(0)
