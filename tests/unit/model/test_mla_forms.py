"""The MLA form cost model and the per-row key lists (pure numpy, no MAX)."""

from __future__ import annotations

import numpy as np

from libs.model.config import parse_config
from libs.model.executor import build_ragged_layout
from libs.model.kernels import MASK_NEG
from libs.model.mla_forms import AttentionForm, choose_form, keys_per_row, row_keys
from libs.model.presets import _COMMON, PRESETS


def small_cfg():
    return parse_config({**_COMMON, **PRESETS["small"]})


def test_row_keys_lists_each_rows_allowed_keys_in_order():
    layout = build_ragged_layout([2, 0, 3], [1, 2, 1])  # keys: 5 past, then 4 new
    keys = row_keys(layout.mask)
    assert keys.index.shape == (4, 4) and keys.index.dtype == np.int32
    assert keys.counts.tolist() == [3, 1, 2, 4]
    assert keys.index[0, :3].tolist() == [0, 1, 5]       # own past, then itself
    assert keys.index[1, :1].tolist() == [6]             # a fresh sequence's first row sees itself
    assert keys.index[2, :2].tolist() == [6, 7]
    assert keys.index[3, :4].tolist() == [2, 3, 4, 8]
    for row, count in enumerate(keys.counts):
        assert (keys.mask[row, :count] == 0).all() and (keys.mask[row, count:] == MASK_NEG).all()
        np.testing.assert_array_equal(np.flatnonzero(layout.mask[row] == 0), keys.index[row, :count])
    assert keys_per_row(layout.mask) == 4


def test_prefill_picks_expanded_and_decode_picks_absorbed():
    cfg = small_cfg()
    prefill = build_ragged_layout([0], [512]).mask
    decode = build_ragged_layout([128] * 32, [1] * 32).mask
    single = build_ragged_layout([128], [1]).mask
    assert choose_form(cfg, *prefill.shape, keys_per_row(prefill)) is AttentionForm.EXPANDED
    assert choose_form(cfg, *decode.shape, keys_per_row(decode)) is AttentionForm.ABSORBED
    assert choose_form(cfg, *single.shape, keys_per_row(single)) is AttentionForm.ABSORBED
    # mixed microbatches: a long prompt with a few short-past decode rows is prefill-like; a
    # prompt chunk riding with many long-past decode rows is not (expanding their past costs more)
    prompt_heavy = build_ragged_layout([0] + [16] * 4, [512] + [1] * 4).mask
    assert choose_form(cfg, *prompt_heavy.shape, keys_per_row(prompt_heavy)) is AttentionForm.EXPANDED
    decode_heavy = build_ragged_layout([0] + [128] * 8, [256] + [1] * 8).mask
    assert choose_form(cfg, *decode_heavy.shape, keys_per_row(decode_heavy)) is AttentionForm.ABSORBED
