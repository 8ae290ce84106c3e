"""KV dtype in the stage contract: bf16 stores half the bytes per token, rounds each value to
bf16, and keeps greedy decoding on the tiny model in agreement with the float32 reference."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.config import load_config
from libs.model.errors import ConfigError
from libs.model.executor import StageBatch, StageExecutor, StageSpec
from libs.model.kernels import make_kernels
from libs.model.kv_store import KvLayout, KvStore, kv_slice
from libs.model.weights import load_stage_weights


def test_bf16_halves_the_bytes_and_rounds_within_bf16_precision():
    fp32, bf16 = KvLayout(2, 8, 4), KvLayout(2, 8, 4, "bf16")
    assert bf16.bytes_per_token * 2 == fp32.bytes_per_token
    store = KvStore(bf16, bytes_limit=1 << 20)
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((2, 20, 8), dtype=np.float32)
    k_rope = rng.standard_normal((2, 20, 4), dtype=np.float32)
    first = kv_slice("r", "l", 0, 0, 0, 20)
    store.commit(first, latent, k_rope)
    got_latent, got_rope = store.past(kv_slice("r", "l", 1, 20, 1, 1), 1)
    assert got_latent.dtype == np.float32 and got_latent.shape == (20, 8)
    np.testing.assert_allclose(got_latent, latent[1], rtol=2.0**-8)
    np.testing.assert_allclose(got_rope, k_rope[1], rtol=2.0**-8)
    assert not np.array_equal(got_latent, latent[1])  # really stored narrower
    with pytest.raises(ConfigError) as err:
        KvLayout(1, 1, 1, "fp4")
    assert err.value.reason == "KV_DTYPE"


def _executor(checkpoint, kv_dtype):
    cfg = load_config(checkpoint)
    n = cfg.num_hidden_layers
    kernels = make_kernels("numpy", cfg, load_stage_weights(checkpoint, cfg, 0, n, True, True))
    return StageExecutor(cfg, StageSpec(0, n, True, True, 1 << 26, kv_dtype), kernels)


def teacher_forced_argmax(executor, tokens: np.ndarray, prefill: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefill, then one decode step per remaining token (the reference's, not the model's):
    the argmax and logits at every decoded position."""
    executor.execute(StageBatch((kv_slice("r", "l", 0, 0, 0, prefill),), tokens[:prefill]))
    logits = []
    for step, position in enumerate(range(prefill, len(tokens)), start=1):
        out = executor.execute(StageBatch((kv_slice("r", "l", step, position, step, 1),),
                                          tokens[position : position + 1]))
        logits.append(out.logits[-1])
    stacked = np.stack(logits)
    return stacked.argmax(axis=1), stacked


def test_bf16_kv_agrees_with_fp32_kv_under_teacher_forcing(tiny_checkpoint):
    cfg = load_config(tiny_checkpoint)
    tokens = np.random.default_rng(3).integers(3, cfg.vocab_size, size=72).astype(np.int32)
    reference, ref_logits = teacher_forced_argmax(_executor(tiny_checkpoint, "fp32"), tokens, 8)
    narrow, bf16_logits = teacher_forced_argmax(_executor(tiny_checkpoint, "bf16"), tokens, 8)
    agreement = float(np.mean(reference == narrow))
    assert agreement >= 0.95, agreement
    assert 0 < np.abs(bf16_logits - ref_logits).max() < 0.1 * np.abs(ref_logits).max()
