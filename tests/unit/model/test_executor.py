"""Stage executor: ragged batching, incremental decode, KV epochs, release and byte limits."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.config import load_config
from libs.model.errors import (
    BackendUnavailableError,
    BatchError,
    KvEpochError,
    KvLimitExceededError,
    ReleasedSequenceError,
)
from libs.model.executor import StageBatch, StageExecutor, StageSpec, build_ragged_layout
from libs.model.kernels import MASK_NEG, make_kernels
from libs.model.kv_store import kv_slice
from libs.model.weights import load_stage_weights


def make_executor(checkpoint, start=0, end=None, kv_limit_bytes=1 << 26, kernels=None):
    cfg = load_config(checkpoint)
    end = cfg.num_hidden_layers if end is None else end
    first, last = start == 0, end == cfg.num_hidden_layers
    if kernels is None:
        kernels = make_kernels("numpy", cfg, load_stage_weights(checkpoint, cfg, start, end, first, last))
    return StageExecutor(cfg, StageSpec(start, end, first, last, kv_limit_bytes), kernels)


def ident(request_id, seq_no, position, rows, epoch=None):
    return kv_slice(request_id, "lease-1", seq_no, position, seq_no if epoch is None else epoch, rows)


TOKENS = {"a": np.array([5, 9, 200, 31, 7, 100, 3], np.int32), "b": np.array([40, 41, 42], np.int32)}


def test_ragged_batch_equals_each_sequence_alone(tiny_checkpoint):
    together = make_executor(tiny_checkpoint).execute(StageBatch(
        (ident("a", 0, 0, 7), ident("b", 0, 0, 3)),
        token_ids=np.concatenate([TOKENS["a"], TOKENS["b"]]), all_logits=True,
    ))
    alone_a = make_executor(tiny_checkpoint).execute(StageBatch((ident("a", 0, 0, 7),), TOKENS["a"], all_logits=True))
    alone_b = make_executor(tiny_checkpoint).execute(StageBatch((ident("b", 0, 0, 3),), TOKENS["b"], all_logits=True))
    np.testing.assert_allclose(together.logits, np.concatenate([alone_a.logits, alone_b.logits]), atol=1e-5)
    layer, ids = together.routed_expert_ids[0]
    assert layer == 1 and ids.shape == (10, 2)


def test_incremental_decode_matches_full_prefill_and_mixes_with_prefill(tiny_checkpoint):
    full = make_executor(tiny_checkpoint).execute(StageBatch((ident("a", 0, 0, 7),), TOKENS["a"], all_logits=True))
    ex = make_executor(tiny_checkpoint)
    ex.execute(StageBatch((ident("a", 0, 0, 5),), TOKENS["a"][:5]))
    step = ex.execute(StageBatch((ident("a", 1, 5, 1), ident("b", 0, 0, 3)),
                                 np.concatenate([TOKENS["a"][5:6], TOKENS["b"]])))
    last = ex.execute(StageBatch((ident("a", 2, 6, 1),), TOKENS["a"][6:]))
    np.testing.assert_allclose(step.logits[0], full.logits[5], atol=1e-5)
    np.testing.assert_allclose(last.logits[0], full.logits[6], atol=1e-5)
    assert step.kv_epochs_before == (1, 0) and step.kv_epochs_after == (2, 1)


def test_epoch_position_and_sequence_mismatches_are_rejected_without_change(tiny_checkpoint):
    ex = make_executor(tiny_checkpoint)
    with pytest.raises(KvEpochError):
        ex.execute(StageBatch((ident("a", 0, 0, 3, epoch=1),), TOKENS["a"][:3]))
    assert ex.execute(StageBatch((ident("a", 0, 0, 3),), TOKENS["a"][:3])).kv_epochs_after == (1,)
    cases = [
        (ident("a", 1, 3, 1, epoch=0), "STALE_KV"), (ident("a", 1, 4, 1), "POSITION"),
        (ident("a", 2, 3, 1), "SEQUENCE"), (ident("a", 0, 0, 1), "SEQUENCE"),
    ]
    for bad, reason in cases:
        with pytest.raises(KvEpochError) as err:
            ex.execute(StageBatch((bad,), TOKENS["a"][3:4]))
        assert err.value.reason == reason
    assert ex.kv.epoch(("a", "lease-1")) == 1 and ex.kv.length(("a", "lease-1")) == 3


def test_failed_execution_leaves_kv_and_epoch_unchanged(tiny_checkpoint):
    ex = make_executor(tiny_checkpoint)
    ex.execute(StageBatch((ident("a", 0, 0, 3),), TOKENS["a"][:3]))
    used = ex.kv_usage().bytes_used
    real_layer = ex.kernels.decoder_layer

    def failing(layer_index, inputs):
        if layer_index == 2:
            raise RuntimeError("device fault")
        return real_layer(layer_index, inputs)

    ex.kernels.decoder_layer = failing
    with pytest.raises(RuntimeError):
        ex.execute(StageBatch((ident("a", 1, 3, 1),), TOKENS["a"][3:4]))
    assert ex.kv.epoch(("a", "lease-1")) == 1 and ex.kv_usage().bytes_used == used
    ex.kernels.decoder_layer = real_layer
    assert ex.execute(StageBatch((ident("a", 1, 3, 1),), TOKENS["a"][3:4])).kv_epochs_after == (2,)


def test_release_frees_bytes_and_tombstones_the_lease(tiny_checkpoint):
    ex = make_executor(tiny_checkpoint)
    ex.execute(StageBatch((ident("a", 0, 0, 7), ident("b", 0, 0, 3)), np.concatenate([TOKENS["a"], TOKENS["b"]])))
    block = ex.kv.block_bytes  # each sequence holds one block (7 and 3 rows of 16)
    assert ex.kv_usage().bytes_used == 2 * block and ex.kv_usage().live_sequences == 2
    assert ex.release("a", "lease-1") is True
    usage = ex.kv_usage()
    assert usage.bytes_used == block and usage.bytes_high_water == 2 * block
    assert usage.blocks.free_blocks == usage.blocks.total_blocks - 1
    with pytest.raises(ReleasedSequenceError) as err:
        ex.execute(StageBatch((ident("a", 0, 0, 1),), TOKENS["a"][:1]))
    assert err.value.reason == "RELEASED"
    assert ex.release("a", "lease-1") is False
    assert ex.release_request("b") == 1 and ex.kv_usage().bytes_used == 0 and ex.kv_usage().live_sequences == 0


def test_kv_block_limit_is_enforced_before_any_change(tiny_checkpoint):
    probe = make_executor(tiny_checkpoint)
    block = probe.kv.block_bytes
    ex = make_executor(tiny_checkpoint, kv_limit_bytes=block)  # one block of 16 tokens
    ex.execute(StageBatch((ident("a", 0, 0, 7),), TOKENS["a"]))
    with pytest.raises(KvLimitExceededError) as err:
        ex.execute(StageBatch((ident("a", 1, 7, 1), ident("b", 0, 0, 3)), np.array([1, 40, 41, 42], np.int32)))
    assert err.value.reason == "KV_LIMIT"
    assert ex.kv_usage().bytes_used == block and ex.kv.epoch(("a", "lease-1")) == 1
    assert ex.execute(StageBatch((ident("a", 1, 7, 1),), np.array([1], np.int32))).kv_epochs_after == (2,)


def test_middle_stage_takes_hidden_and_validates_shapes(tiny_checkpoint):
    first = make_executor(tiny_checkpoint, 0, 2)
    middle = make_executor(tiny_checkpoint, 2, 4)
    out = first.execute(StageBatch((ident("a", 0, 0, 7),), TOKENS["a"]))
    assert out.logits is None and out.hidden.shape == (7, 64)
    with pytest.raises(BatchError):
        middle.execute(StageBatch((ident("a", 0, 0, 7),), hidden=out.hidden[:6]))
    assert middle.execute(StageBatch((ident("a", 0, 0, 7),), hidden=out.hidden)).logits.shape == (1, 512)


def test_bad_batches_are_rejected(tiny_checkpoint):
    ex = make_executor(tiny_checkpoint)
    with pytest.raises(BatchError):
        ex.execute(StageBatch((ident("a", 0, 0, 2),), np.array([1, 512], np.int32)))
    with pytest.raises(KvEpochError):
        ex.execute(StageBatch((ident("a", 0, 0, 1), ident("a", 0, 0, 1)), np.array([1, 2], np.int32)))
    with pytest.raises(BatchError):
        ex.execute(StageBatch((), np.zeros(0, np.int32)))


def test_unknown_backend_is_an_error_not_a_fallback(tiny_checkpoint):
    cfg = load_config(tiny_checkpoint)
    weights = load_stage_weights(tiny_checkpoint, cfg, 0, 1, True, False)
    with pytest.raises(BackendUnavailableError):
        make_kernels("cuda-magic", cfg, weights)
    with pytest.raises(BackendUnavailableError):
        make_kernels("numpy", cfg, weights, device="gpu:0")


def test_ragged_mask_and_positions():
    layout = build_ragged_layout(past_lengths=[2, 0], row_counts=[1, 2])
    assert layout.positions.tolist() == [2, 0, 1]
    allowed = (layout.mask == 0).astype(int).tolist()
    # key columns: past of seq0 (2), then new rows: seq0 row, seq1 row0, seq1 row1
    assert allowed == [[1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert layout.mask.min() == MASK_NEG


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4)), min_size=1, max_size=5))
def test_ragged_mask_row_sees_exactly_its_past_and_earlier_rows(shapes):
    pasts, rows = [p for p, _ in shapes], [r for _, r in shapes]
    layout = build_ragged_layout(pasts, rows)
    allowed = layout.mask == 0
    total_past = sum(pasts)
    row = 0
    for s, (past, count) in enumerate(shapes):
        past_start, new_start = sum(pasts[:s]), total_past + sum(rows[:s])
        for j in range(count):
            expected = np.zeros(allowed.shape[1], bool)
            expected[past_start : past_start + past] = True
            expected[new_start : new_start + j + 1] = True
            assert np.array_equal(allowed[row], expected)
            assert layout.positions[row] == past + j
            row += 1
