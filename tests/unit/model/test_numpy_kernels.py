"""Routing, MoE and attention numerics of the numpy reference kernels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import libs.model.numpy_kernels as numpy_kernels
from libs.model.config import parse_config
from libs.model.executor import build_ragged_layout
from libs.model.kernels import LayerInputs
from libs.model.numpy_kernels import absorbed_attention_is_cheaper, mla_attention, moe, route, silu, top_k_desc
from libs.model.presets import preset_config
from libs.model.rope import rope_tables
from libs.model.weights import AttentionWeights, MoeWeights, SwiGluWeights

RNG = np.random.default_rng(0)


def cfg(**overrides):
    return parse_config({**preset_config("tiny", 0, 2), **overrides})


def test_top_k_desc_orders_best_first():
    scores = np.array([[0.1, 0.5, 0.2, 0.9], [0.3, 0.3, 0.1, 0.0]], np.float32)
    assert top_k_desc(scores, 2).tolist() == [[3, 1], [0, 1]]


def test_group_limited_greedy_picks_only_from_the_best_groups():
    c = cfg(topk_method="group_limited_greedy", n_group=4, topk_group=2, num_experts_per_tok=3)
    x = RNG.standard_normal((200, 64)).astype(np.float32)
    router = RNG.standard_normal((8, 64)).astype(np.float32) / 8
    r = route(c, x, router)
    scores = np.exp(x @ router.T)
    best_groups = np.argsort(-scores.reshape(200, 4, 2).max(-1), axis=-1)[:, :2]
    chosen_groups = r.expert_ids // 2
    assert all(set(chosen_groups[i]) <= set(best_groups[i]) for i in range(200))
    greedy = route(cfg(num_experts_per_tok=3), x, router)
    assert not np.array_equal(np.sort(greedy.expert_ids), np.sort(r.expert_ids))


def test_scaling_and_topk_normalisation():
    x = RNG.standard_normal((50, 64)).astype(np.float32)
    router = RNG.standard_normal((8, 64)).astype(np.float32) / 8
    plain = route(cfg(), x, router)
    scaled = route(cfg(routed_scaling_factor=2.5), x, router)
    normed = route(cfg(norm_topk_prob=True, routed_scaling_factor=2.5), x, router)
    np.testing.assert_allclose(scaled.weights, plain.weights * 2.5, rtol=1e-6)
    np.testing.assert_allclose(normed.weights.sum(-1), 1.0, rtol=1e-6)
    assert np.all(plain.weights.sum(-1) < 1.0)


def test_grouped_moe_equals_dense_weighted_sum_over_all_experts():
    c = cfg()
    e, h, inner = 8, 64, 32
    w = MoeWeights(
        router=RNG.standard_normal((e, h)).astype(np.float32) / 8,
        experts_gate=RNG.standard_normal((e, inner, h)).astype(np.float32) / 8,
        experts_up=RNG.standard_normal((e, inner, h)).astype(np.float32) / 8,
        experts_down=RNG.standard_normal((e, h, inner)).astype(np.float32) / 6,
        shared=None,
    )
    x = RNG.standard_normal((33, h)).astype(np.float32)
    out, ids = moe(c, x, w)
    r = route(c, x, w.router)
    dense = np.zeros_like(x)
    for j in range(e):  # reference: every expert on every row, weight 0 where not routed
        weight = np.where(r.expert_ids == j, r.weights, 0).sum(-1, keepdims=True)
        dense += weight * ((silu(x @ w.experts_gate[j].T) * (x @ w.experts_up[j].T)) @ w.experts_down[j].T)
    np.testing.assert_allclose(out, dense, atol=1e-5)
    shared = SwiGluWeights(w.experts_gate[0], w.experts_up[0], w.experts_down[0])
    with_shared, _ = moe(c, x, dataclasses.replace(w, shared=shared))
    assert not np.allclose(with_shared, out)
    assert ids.dtype == np.int32 and ids.shape == (33, 2)


def test_silu_is_stable_for_extreme_inputs():
    x = np.array([-1e4, -10, 0, 10, 1e4], np.float32)
    with np.errstate(all="raise"):
        y = silu(x)
    with np.errstate(over="ignore"):
        expected = x / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(y, expected, atol=1e-5)


def test_decode_attends_absorbed_and_a_long_prefill_expanded():
    c = parse_config(preset_config("small", 0, 2))
    # small: C=256, nope=64, rope=32, v=64: expanding wins above 256*128/(512-128) = 85.3 rows.
    assert [absorbed_attention_is_cheaper(c, rows) for rows in (1, 32, 85, 86, 200)] == [
        True, True, True, False, False]


@pytest.mark.parametrize("rows", [(1, 1), (5, 40)])
def test_both_attention_forms_give_the_same_output(monkeypatch, rows):
    """A ragged batch of two sequences with pasts of 7 and 19 rows, through the absorbed and
    the expanded form: the same attention (float32 rounding apart)."""
    c = cfg()
    heads, nope, rope, v = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    h, rank = c.hidden_size, c.kv_lora_rank

    def w(*shape):
        return (RNG.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    weights = AttentionWeights(q_proj=w(heads * (nope + rope), h), q_a_proj=None, q_a_norm=None, q_b_proj=None,
                               kv_a_proj=w(rank + rope, h), kv_a_norm=np.ones(rank, np.float32),
                               kv_b_proj=w(heads * (nope + v), rank), o_proj=w(h, heads * v))
    pasts = [7, 19]
    layout = build_ragged_layout(pasts, list(rows))
    cos, sin = rope_tables(c).cos_sin(layout.positions)
    inputs = LayerInputs(hidden=w(sum(rows), h), rope_cos=cos, rope_sin=sin,
                         past_latent=w(sum(pasts), rank), past_k_rope=w(sum(pasts), rope), mask=layout.mask)
    outputs = {}
    for absorbed in (True, False):
        monkeypatch.setattr(numpy_kernels, "absorbed_attention_is_cheaper", lambda _c, _r, a=absorbed: a)
        outputs[absorbed] = mla_attention(c, inputs.hidden, weights, inputs)
    np.testing.assert_allclose(outputs[True][0], outputs[False][0], rtol=1e-4, atol=1e-5)
    assert np.array_equal(outputs[True][1], outputs[False][1])  # new KV rows do not depend on the form
