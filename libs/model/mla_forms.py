"""The two forms of MLA attention, their cost model, and the per-row key lists the absorbed form uses.

Both forms compute the same attention; they differ in where `kv_b_proj` is applied:

- expanded: every key's latent goes through `kv_b_proj` into per-head keys and values, and
  every row of the microbatch scores every key of it under the additive mask. The expansion is
  paid once per key, so it wins when many rows share the keys (prefill).
- absorbed: `kv_b_proj`'s key half is folded into the queries and its value half into the
  output, so rows score the cached latents directly. Each row gathers only the keys its mask
  allows (its own sequence's past and earlier rows), so a decode microbatch of B sequences does
  B short attentions instead of one B-times-wider masked one.

A stage picks the cheaper form per microbatch from its shape (`choose_form`); the choice never
changes the result beyond float rounding, so a mixed prefill + decode microbatch is correct in
either form.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.kernels import MASK_NEG


class AttentionForm(Enum):
    ABSORBED = "absorbed"
    EXPANDED = "expanded"


@dataclass(frozen=True)
class RowKeys:
    """Per row, the keys its mask allows, padded to the longest row."""

    index: np.ndarray  # int32 [R, K]: positions in [past ; new] keys; padding points at key 0
    mask: np.ndarray   # float32 [R, K]: 0 for a real key, MASK_NEG for padding
    counts: np.ndarray  # int64 [R]: real keys per row


def keys_per_row(mask: np.ndarray) -> int:
    """The most keys any row of an additive [R, T] mask allows."""
    return int((mask == 0).sum(axis=1).max(initial=0))


def row_keys(mask: np.ndarray) -> RowKeys:
    """The allowed keys of each row of an additive [R, T] mask (0 = allowed), in key order."""
    allowed = mask == 0
    counts = allowed.sum(axis=1)
    width = max(int(counts.max(initial=0)), 1)
    rows, cols = np.nonzero(allowed)  # row-major, so each row's keys come out in key order
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slots = np.arange(rows.size) - np.repeat(starts, counts)
    index = np.zeros((mask.shape[0], width), np.int32)
    padded = np.full((mask.shape[0], width), MASK_NEG, np.float32)
    index[rows, slots] = cols
    padded[rows, slots] = 0
    return RowKeys(index, padded, counts)


def attention_flops(cfg: DeepseekV2Config, form: AttentionForm, rows: int, keys: int, keys_per_row: int) -> int:
    """Multiply-adds x2 of the attention core (between q/kv_a projections and o_proj); a cost
    model used to pick a form, not a measurement. `keys_per_row` is the padded per-row width."""
    heads, rank, rope = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nope, v = cfg.qk_nope_head_dim, cfg.v_head_dim
    if form is AttentionForm.EXPANDED:
        expand = keys * rank * heads * (nope + v)
        attend = rows * keys * heads * (nope + rope + v)
        return 2 * (expand + attend)
    fold = rows * heads * (nope * rank + rank * v)
    attend = rows * keys_per_row * heads * (rank + rope + rank)
    gather = rows * keys_per_row * (rank + rope)  # copies, counted as one op per element
    return 2 * (fold + attend) + gather


def choose_form(cfg: DeepseekV2Config, rows: int, keys: int, keys_per_row: int) -> AttentionForm:
    expanded = attention_flops(cfg, AttentionForm.EXPANDED, rows, keys, keys_per_row)
    absorbed = attention_flops(cfg, AttentionForm.ABSORBED, rows, keys, keys_per_row)
    return AttentionForm.EXPANDED if expanded < absorbed else AttentionForm.ABSORBED
