"""fp8 KV in the stage contract: e4m3 latent with a power-of-two scale per (block, layer), rope
key bf16; exact block bytes in the store and the planner; appended rows never corrupt earlier
ones beyond the fp8 bound; backends that cannot hold fp8 refuse it (KV_DTYPE_BACKEND)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from libs.fnx2 import SequenceSlice
from libs.model.errors import ConfigError, KvLimitExceededError
from libs.model.kv_blocks import KV_BLOCK_TOKENS, blocks_for, require_kv_backend
from libs.model.kv_store import KvLayout, KvStore, kv_slice
from services.planner.costs import build_workload
from services.planner.inventory import Target
from services.planner.model import describe_config
from tests.unit.planner.factories import synthetic_config

B = KV_BLOCK_TOKENS


def _slice(position: int, rows: int) -> SequenceSlice:
    return kv_slice("r", "l", position and 1, position, position and 1, rows)


def test_block_bytes_are_latent_bytes_plus_scale_bytes_plus_bf16_rope_bytes():
    layers, rank, rope = 3, 512, 64
    fp8 = KvLayout(layers, rank, rope, "fp8")
    assert fp8.block_bytes() == layers * (B * (rank * 1 + rope * 2) + 4)
    assert KvLayout(layers, rank, rope, "fp32").block_bytes() == layers * B * (rank + rope) * 4
    assert fp8.bytes_per_token_exact * B == fp8.block_bytes()  # exact, a quarter byte per layer
    assert fp8.bytes_per_token == -(-fp8.block_bytes() // B)
    store = KvStore(fp8, bytes_limit=10 * fp8.block_bytes() + fp8.block_bytes() - 1)
    assert store.block_bytes == fp8.block_bytes() and store.pool.total_blocks == 10


def test_store_usage_counts_whole_fp8_blocks_and_refuses_past_the_limit():
    layout = KvLayout(2, 8, 4, "fp8")
    store = KvStore(layout, bytes_limit=3 * layout.block_bytes())
    rows = np.ones((2, 2 * B + 1, 8), np.float32), np.ones((2, 2 * B + 1, 4), np.float32)
    store.commit(kv_slice("a", "l", 0, 0, 0, 2 * B + 1), *rows)
    assert store.bytes_used() == 3 * layout.block_bytes() == store.usage().bytes_used
    with pytest.raises(KvLimitExceededError):
        store.commit(kv_slice("b", "l", 0, 0, 0, 1), rows[0][:, :1], rows[1][:, :1])


def test_planner_memory_term_is_the_stage_block_accounting():
    raw = synthetic_config(2, experts=4, top_k=2, hidden=2048)  # kv_lora 512, rope 64
    model = describe_config(raw, "sha256:x", kv_dtype="fp8")
    layer = model.layers[0]
    assert (layer.kv_bytes_per_token, layer.kv_scale_bytes_per_block) == (512 + 64 * 2, 4)
    assert describe_config(raw, "sha256:x", kv_dtype="bf16").layers[0].kv_scale_bytes_per_block == 0
    tokens, sequences = 1024, 3
    work = build_workload(model, Target(context_tokens=tokens, concurrency=sequences))
    per_layer_block = KvLayout(1, 512, 64, "fp8").block_bytes()
    assert int(work.layer_kv_bytes[0]) == sequences * blocks_for(tokens) * per_layer_block


def test_one_write_rounds_within_half_an_fp8_step_and_rope_within_bf16():
    store = KvStore(KvLayout(2, 8, 4, "fp8"), bytes_limit=1 << 20)
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((2, 40, 8)).astype(np.float32) * 3
    k_rope = rng.standard_normal((2, 40, 4)).astype(np.float32)
    store.commit(_slice(0, 40), latent, k_rope)
    for layer in range(2):
        got, rope = store.past(_slice(40, 1), layer)
        assert got.dtype == np.float32 and got.shape == (40, 8)
        np.testing.assert_allclose(rope, k_rope[layer], rtol=2.0**-8)
        for block in range(blocks_for(40)):
            want = latent[layer, block * B : (block + 1) * B]
            scale = store._scale[layer, store._entries[("r", "l")].blocks[block]]
            err = np.abs(got[block * B : (block + 1) * B] - want)
            assert np.all(err <= np.maximum(np.abs(want) * 2.0**-4, scale * 2.0**-10))
            assert scale <= np.abs(want).max() / 224  # the scale uses the e4m3 range (max 448)
        assert not np.array_equal(got, latent[layer]) and np.abs(got - latent[layer]).max() < 0.5


def test_appended_rows_that_raise_the_scale_keep_earlier_rows_within_the_bound():
    """Rows arrive one at a time, each 1.9x larger than the last, so every append raises the
    block scale and requantizes the rows before it."""
    store = KvStore(KvLayout(1, 64, 4, "fp8"), bytes_limit=1 << 20)
    rng = np.random.default_rng(5)
    rows = 20
    growth = (1.9 ** np.arange(rows))[None, :, None]
    latent = (rng.standard_normal((1, rows, 64)) * growth).astype(np.float32)
    latent[0, 3, :4] = [1e-4, -1e-4, 0.0, 2.0**-6]  # values that fall into the subnormals later
    k_rope = rng.standard_normal((1, rows, 4)).astype(np.float32)
    scales = []
    for position in range(rows):
        store.commit(_slice(position, 1), latent[:, position : position + 1], k_rope[:, position : position + 1])
        scales.append(float(store._scale[0, store._entries[("r", "l")].blocks[position // B]]))
    got, _ = store.past(_slice(rows, 1), 0)
    assert scales[B - 1] > 100 * scales[0]  # the first block's scale really grew
    for position in range(rows):
        final = scales[B - 1] if position < B else scales[-1]
        want = latent[0, position]
        err = np.abs(got[position] - want)
        assert np.all(err <= np.abs(want) * 2.0**-4 + final * 2.0**-9), position


def test_appended_rows_that_do_not_raise_the_scale_leave_earlier_codes_untouched():
    store = KvStore(KvLayout(1, 16, 4, "fp8"), bytes_limit=1 << 20)
    rng = np.random.default_rng(2)
    first = rng.standard_normal((1, 5, 16)).astype(np.float32) * 10
    store.commit(_slice(0, 5), first, np.zeros((1, 5, 4), np.float32))
    block = store._entries[("r", "l")].blocks[0]
    codes, scale = store._latent[0, block, :5].copy(), store._scale[0, block]
    small = first[:, :3] / 4
    store.commit(_slice(5, 3), small, np.zeros((1, 3, 4), np.float32))
    np.testing.assert_array_equal(store._latent[0, block, :5], codes)
    assert store._scale[0, block] == scale


def test_a_recycled_block_takes_a_fresh_scale():
    layout = KvLayout(1, 8, 4, "fp8")
    store = KvStore(layout, bytes_limit=layout.block_bytes())
    store.commit(kv_slice("a", "l", 0, 0, 0, 2), np.full((1, 2, 8), 1000.0, np.float32),
                 np.zeros((1, 2, 4), np.float32))
    store.release("a", "l")
    small = np.full((1, 2, 8), 0.01, np.float32)
    store.commit(kv_slice("b", "l", 0, 0, 0, 2), small, np.zeros((1, 2, 4), np.float32))
    got, _ = store.past(kv_slice("b", "l", 1, 2, 1, 1), 0)
    np.testing.assert_allclose(got, small[0], rtol=2.0**-4)


def test_non_finite_latents_saturate_or_stay_nan_and_never_become_inf():
    store = KvStore(KvLayout(1, 4, 4, "fp8"), bytes_limit=1 << 20)
    latent = np.array([[[1.0, np.inf, -np.inf, np.nan]]], np.float32)
    store.commit(_slice(0, 1), latent, np.zeros((1, 1, 4), np.float32))
    got, _ = store.past(_slice(1, 1), 0)
    assert got[0, 0] == 1.0 and got[0, 1] > 0 and got[0, 2] < 0 and np.isnan(got[0, 3])
    assert np.isfinite(got[0, :3]).all()


def test_fp8_is_refused_on_max_with_a_stable_reason():
    require_kv_backend("fp8", "numpy")
    require_kv_backend("bf16", "max")
    with pytest.raises(ConfigError) as err:
        require_kv_backend("fp8", "max")
    assert err.value.reason == "KV_DTYPE_BACKEND" and "max" in str(err.value)
    with pytest.raises(ConfigError) as err:
        require_kv_backend("fp4", "numpy")
    assert err.value.reason == "KV_DTYPE"


def test_a_max_stage_executor_refuses_fp8_before_anything_else():
    from libs.model.executor import StageExecutor, StageSpec

    cfg = SimpleNamespace(num_hidden_layers=2)
    with pytest.raises(ConfigError) as err:
        StageExecutor(cfg, StageSpec(0, 2, True, True, kv_dtype="fp8"), SimpleNamespace(name="max"))
    assert err.value.reason == "KV_DTYPE_BACKEND"


def test_a_max_worker_configured_for_fp8_kv_does_not_start():
    from services.stage_worker.config import StageWorkerConfig

    with pytest.raises(SystemExit) as err:
        StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "max", "FORNAX_KV_DTYPE": "fp8"})
    assert "KV_DTYPE_BACKEND" in str(err.value)
    assert StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "numpy", "FORNAX_KV_DTYPE": "fp8"}).kv_dtype == "fp8"


def test_parity_refuses_fp8_on_max_before_loading_anything(tmp_path):
    from libs.model.parity import ParityRequest, run_parity

    with pytest.raises(ConfigError) as err:
        run_parity(ParityRequest(str(tmp_path / "no-such-checkpoint"), 1, "max", kv_dtype="fp8"))
    assert err.value.reason == "KV_DTYPE_BACKEND"


def test_a_max_worker_refuses_a_load_asking_for_fp8_kv_before_loading_weights(tmp_path):
    from libs.common.kinds import Backend, DType
    from services.stage_worker.runtime import LoadSpec, PlanBinding, StageRuntime

    runtime = StageRuntime(Backend.MAX, "cpu", 1 << 20)
    spec = LoadSpec(0, 1, 0, 1, PlanBinding("p", "sha256:" + "0" * 64, "g"), Backend.MAX, DType.FP32,
                    checkpoint_dir=str(tmp_path / "never-read"), return_logits=True, kv_dtype="fp8")
    with pytest.raises(ConfigError) as err:
        runtime._check_spec(spec)
    assert err.value.reason == "KV_DTYPE_BACKEND" and err.value.field == "spec.kv_dtype"
    runtime._check_spec(LoadSpec(**{**spec.__dict__, "kv_dtype": "bf16"}))  # other dtypes pass
    fp8_worker = StageRuntime(Backend.MAX, "cpu", 1 << 20, kv_dtype="fp8")
    with pytest.raises(ConfigError):
        fp8_worker._check_spec(LoadSpec(**{**spec.__dict__, "kv_dtype": None}))  # the worker's own default


def test_the_route_admission_term_follows_the_kv_dtype():
    from services.orchestrator.engine.domain import mla_kv_bytes_per_token

    assert mla_kv_bytes_per_token(512, 64, 4) == (512 + 64) * 4 * 4
    assert mla_kv_bytes_per_token(512, 64, 4, "bf16") == (512 + 64) * 2 * 4
    # fp8: 4 layers x (512 + 2 * 64 + 4 / 16) = 2561 bytes a token, exactly
    assert mla_kv_bytes_per_token(512, 64, 4, "fp8") == 2561 == KvLayout(4, 512, 64, "fp8").bytes_per_token_exact
    assert mla_kv_bytes_per_token(512, 64, 3, "fp8") == 1921  # 1920.75 rounded up: never under the stage
