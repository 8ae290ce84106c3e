"""MAX graphs against the numpy float32 reference, per layer kind, on ragged batches with
several rows per sequence and non-empty past."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.executor import build_ragged_layout
from libs.model.kernels import LayerInputs
from libs.model.rope import rope_tables

# the first run compiles five graphs (minutes on 2 cores);
# cold compiles can outlast the default 600 s test timeout on a busy 2-core host.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TOL = 1e-4
# (past rows, new rows) per sequence: prefill with past, chunked prefill, decode, fresh prefill,
# and decode of one, two and three sequences (routed experts then see one to a few rows each)
BATCHES = [([3, 5], [4, 2]), ([0, 6, 2], [5, 1, 1]), ([9], [1]), ([4, 7], [1, 1]), ([2, 3, 5], [1, 1, 1])]


def layer_inputs(cfg, past_lengths, row_counts, seed):
    rng = np.random.default_rng(seed)
    layout = build_ragged_layout(past_lengths, row_counts)
    cos, sin = rope_tables(cfg).cos_sin(layout.positions)
    rows, past = sum(row_counts), sum(past_lengths)
    return LayerInputs(
        hidden=rng.standard_normal((rows, cfg.hidden_size)).astype(np.float32),
        rope_cos=cos,
        rope_sin=sin,
        past_latent=rng.standard_normal((past, cfg.kv_lora_rank)).astype(np.float32),
        past_k_rope=rng.standard_normal((past, cfg.qk_rope_head_dim)).astype(np.float32),
        mask=layout.mask,
    )


@pytest.mark.parametrize("layer_kind", ["dense", "moe"])
@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_decoder_layer_matches_numpy(full_stage, numpy_kernels, max_kernels, layer_kind, batch):
    cfg, _ = full_stage
    layer = 0 if layer_kind == "dense" else cfg.first_k_dense_replace
    assert cfg.is_moe_layer(layer) == (layer_kind == "moe")
    inputs = layer_inputs(cfg, *BATCHES[batch], seed=batch)
    ours, ref = max_kernels.decoder_layer(layer, inputs), numpy_kernels.decoder_layer(layer, inputs)
    for field in ("hidden", "new_latent", "new_k_rope"):
        got, want = getattr(ours, field), getattr(ref, field)
        assert got.dtype == np.float32 and got.shape == want.shape, field
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0, err_msg=field)
    if layer_kind == "dense":
        assert ours.routed_expert_ids is None
    else:
        assert ours.routed_expert_ids.dtype == np.int32
        np.testing.assert_array_equal(ours.routed_expert_ids, ref.routed_expert_ids)


def test_every_moe_layer_binds_its_own_weights(full_stage, numpy_kernels, max_kernels):
    cfg, _ = full_stage
    inputs = layer_inputs(cfg, [2, 3], [3, 1], seed=7)
    moe_layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
    outs = [max_kernels.decoder_layer(i, inputs).hidden for i in moe_layers]
    for i, out in zip(moe_layers, outs, strict=True):
        np.testing.assert_allclose(out, numpy_kernels.decoder_layer(i, inputs).hidden, atol=TOL, rtol=0)
    assert len(moe_layers) > 1 and not np.allclose(outs[0], outs[1])


def test_embed_and_final_match_numpy(full_stage, numpy_kernels, max_kernels):
    cfg, _ = full_stage
    ids = np.array([0, 5, cfg.vocab_size - 1, 5], np.int32)
    np.testing.assert_array_equal(max_kernels.embed(ids), numpy_kernels.embed(ids))
    hidden = np.random.default_rng(3).standard_normal((4, cfg.hidden_size)).astype(np.float32)
    logits = max_kernels.final(hidden)
    assert logits.shape == (4, cfg.vocab_size)
    np.testing.assert_allclose(logits, numpy_kernels.final(hidden), atol=TOL, rtol=0)


def test_mask_with_wrong_key_count_is_rejected(full_stage, max_kernels):
    cfg, _ = full_stage
    inputs = layer_inputs(cfg, [2], [2], seed=1)
    bad = LayerInputs(inputs.hidden, inputs.rope_cos, inputs.rope_sin, inputs.past_latent,
                      inputs.past_k_rope, inputs.mask[:, 1:].copy())
    with pytest.raises(Exception, match="mask must be"):
        max_kernels.decoder_layer(0, bad)


def test_report_names_build_and_compile_times(max_kernels):
    assert max_kernels.name == "max" and max_kernels.build.startswith("max ")
    assert set(max_kernels.compile_seconds) == {"embed", "dense_layer", "moe_layer", "final", "expert"}
