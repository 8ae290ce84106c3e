"""Both MLA forms of the MAX layer graphs against the numpy float32 reference: prefill (seq > 1),
past > 0, mixed prefill + decode microbatches, and a prefill-then-decode switch of forms."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.executor import build_ragged_layout
from libs.model.kernels import LayerInputs, make_kernels
from libs.model.max_kernels import MaxOptions
from libs.model.mla_forms import AttentionForm
from libs.model.rope import rope_tables

from .test_max_kernels import TOL, layer_inputs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# (past rows, new rows) per sequence: fresh prefill, prefill with past, decode, mixed
BATCHES = {
    "prefill": ([0], [12]),
    "prefill_past": ([7, 3], [5, 6]),
    "decode": ([9, 4, 13], [1, 1, 1]),
    "mixed": ([0, 11, 6], [8, 1, 1]),
}


@pytest.fixture(scope="module")
def forced(full_stage):
    """MAX kernels pinned to each form; they share the compiled graphs of `max_kernels`."""
    cfg, weights = full_stage
    return {form: make_kernels("max", cfg, weights, "cpu", MaxOptions(attention_form=form.value))
            for form in AttentionForm}


def assert_matches(ours, ref) -> None:
    for field in ("hidden", "new_latent", "new_k_rope"):
        got, want = getattr(ours, field), getattr(ref, field)
        assert got.dtype == np.float32 and got.shape == want.shape, field
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0, err_msg=field)
    if ref.routed_expert_ids is not None:
        np.testing.assert_array_equal(ours.routed_expert_ids, ref.routed_expert_ids)


@pytest.mark.parametrize("form", list(AttentionForm), ids=lambda f: f.value)
@pytest.mark.parametrize("layer_kind", ["dense", "moe"])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_each_form_matches_numpy(full_stage, numpy_kernels, forced, form, layer_kind, batch):
    cfg, _ = full_stage
    layer = 0 if layer_kind == "dense" else cfg.first_k_dense_replace
    inputs = layer_inputs(cfg, *BATCHES[batch], seed=len(batch))
    assert forced[form].attention_form(inputs.mask) is form
    assert_matches(forced[form].decoder_layer(layer, inputs), numpy_kernels.decoder_layer(layer, inputs))


def _step(kernels, cfg, layer, hidden, past_latent, past_k_rope, positions):
    past = past_latent.shape[0]
    layout = build_ragged_layout([past], [hidden.shape[0]])
    assert np.array_equal(layout.positions, positions)
    cos, sin = rope_tables(cfg).cos_sin(layout.positions)
    return kernels.decoder_layer(layer, LayerInputs(hidden, cos, sin, past_latent, past_k_rope, layout.mask))


def _extend(kv, out):
    return np.concatenate([kv[0], out.new_latent]), np.concatenate([kv[1], out.new_k_rope])


@pytest.mark.parametrize("layer_kind", ["dense", "moe"])
def test_prefill_then_decode_switches_form_and_matches_numpy(full_stage, numpy_kernels, max_kernels, layer_kind):
    """One sequence: a long prefill (the stage picks the expanded form), then decode steps on the
    KV it produced (absorbed form); every step matches numpy run on the same chain."""
    cfg, _ = full_stage
    layer = 0 if layer_kind == "dense" else cfg.first_k_dense_replace
    rng = np.random.default_rng(11)
    prompt = 48
    hidden = rng.standard_normal((prompt, cfg.hidden_size)).astype(np.float32)
    empty = (np.zeros((0, cfg.kv_lora_rank), np.float32), np.zeros((0, cfg.qk_rope_head_dim), np.float32))
    forms = []
    ours_kv, ref_kv = empty, empty
    for step in range(3):
        rows = hidden if step == 0 else rng.standard_normal((1, cfg.hidden_size)).astype(np.float32)
        past = ours_kv[0].shape[0]
        positions = np.arange(past, past + rows.shape[0])
        forms.append(max_kernels.attention_form(build_ragged_layout([past], [rows.shape[0]]).mask))
        ours = _step(max_kernels, cfg, layer, rows, *ours_kv, positions)
        ref = _step(numpy_kernels, cfg, layer, rows, *ref_kv, positions)
        assert_matches(ours, ref)
        ours_kv = _extend(ours_kv, ours)
        ref_kv = _extend(ref_kv, ref)
    assert forms == [AttentionForm.EXPANDED, AttentionForm.ABSORBED, AttentionForm.ABSORBED]


@pytest.mark.parametrize("form", list(AttentionForm), ids=lambda f: f.value)
@pytest.mark.parametrize("key_delta", [-1, 1])
def test_mask_with_wrong_key_count_is_rejected_in_either_form(full_stage, forced, form, key_delta):
    """The absorbed form reads the mask on the host; a mask one key narrower or wider fails
    before any key is gathered, as the expanded form's graph check does."""
    from libs.model.errors import BatchError

    cfg, _ = full_stage
    inputs = layer_inputs(cfg, [2, 1], [2, 1], seed=1)
    width = inputs.mask.shape[1] + key_delta
    mask = np.zeros((inputs.mask.shape[0], width), np.float32)
    mask[:, : min(width, inputs.mask.shape[1])] = inputs.mask[:, :width]
    bad = LayerInputs(inputs.hidden, inputs.rope_cos, inputs.rope_sin, inputs.past_latent, inputs.past_k_rope, mask)
    for layer in (0, cfg.first_k_dense_replace):
        with pytest.raises(BatchError, match=r"mask must be \[R, P \+ R\]"):
            forced[form].decoder_layer(layer, bad)


def test_unknown_attention_form_is_rejected(full_stage):
    from libs.model.errors import BackendUnavailableError

    cfg, weights = full_stage
    with pytest.raises(BackendUnavailableError, match="attention form"):
        make_kernels("max", cfg, weights, "cpu", MaxOptions(attention_form="latent"))
