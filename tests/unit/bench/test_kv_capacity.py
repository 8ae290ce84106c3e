"""`fornax bench serve --kv-dtype`: sequence counts from the stage's block accounting, checked by
admitting them, and the sequences_vs_fp32_<dtype> ratios (tiny checkpoint, numpy, small limit)."""

from __future__ import annotations

import json

import pytest

from apps.bench.kv_capacity import KvCapacityOptions, capacity_for, check_options, ratios, run
from libs.model.config import load_config
from libs.model.errors import ConfigError
from libs.model.kv_store import KvLayout

TOKENS = 64  # 4 blocks a sequence


def test_capacity_is_whole_sequences_of_whole_blocks_at_the_limit():
    fp8 = KvLayout(2, 32, 8, "fp8")
    block = 2 * (16 * (32 + 8 * 2) + 4)
    assert fp8.block_bytes() == block
    cap = capacity_for(fp8, 36 * block - 1, TOKENS)
    assert (cap.block_bytes, cap.blocks, cap.blocks_per_sequence, cap.sequences) == (block, 35, 4, 8)
    wide = capacity_for(KvLayout(2, 32, 8, "fp32"), 36 * block - 1, TOKENS)
    assert (wide.block_bytes, wide.blocks, wide.sequences) == (2 * 16 * 40 * 4, 10, 2)
    assert ratios({"fp32": wide, "fp8": cap}) == {"sequences_vs_fp32_fp8": 4.0}
    none = capacity_for(KvLayout(2, 32, 8, "fp32"), 3 * wide.block_bytes, TOKENS)
    assert none.sequences == 0 and ratios({"fp32": none, "fp8": cap}) == {}


def test_bad_options_are_refused_before_anything_loads():
    with pytest.raises(ConfigError) as err:
        check_options(KvCapacityOptions("missing", ("fp32", "fp8"), backend="max"))
    assert err.value.reason == "KV_DTYPE_BACKEND"
    with pytest.raises(ConfigError) as err:
        check_options(KvCapacityOptions("missing", ("fp4",)))
    assert err.value.reason == "KV_DTYPE"
    with pytest.raises(ValueError, match="BAD_OPTION"):
        check_options(KvCapacityOptions("missing", ("fp8",), sequence_tokens=0))


def test_the_bench_admits_the_contract_sequences_and_reports_labelled_ratios(tiny_checkpoint):
    cfg = load_config(tiny_checkpoint)
    fp32 = KvLayout(cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim).block_bytes()
    limit = 12 * 4 * fp32  # 12 fp32 sequences of 4 blocks
    options = KvCapacityOptions(str(tiny_checkpoint), ("fp32", "bf16", "fp8"), kv_limit_bytes=limit,
                                sequence_tokens=TOKENS, decode_sequences=2, decode_steps=1, repeats=1)
    report = run(options, "fornax bench serve --kv-dtype fp32,bf16,fp8")
    rows = report["kv_dtypes"]
    assert rows["fp32"]["sequences"] == 12 and rows["bf16"]["sequences"] == 24
    for name, row in rows.items():
        layout = KvLayout(cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim, name)
        assert row["block_bytes"] == layout.block_bytes()
        assert row["sequences"] == (limit // layout.block_bytes()) // 4
        assert row["sequences_admitted"] == row["sequences"] and row["next_sequence_refused"] is True
        assert row["kv_bytes_used"] == row["sequences"] * 4 * layout.block_bytes()
        assert row["decode_sequences"] == 2 and row["decode_tokens_per_s"] > 0
    assert report["sequences_vs_fp32_bf16"] == 2.0
    assert report["sequences_vs_fp32_fp8"] == rows["fp8"]["sequences"] / 12 > 2.0
    labels = report["figures"]
    assert labels["sequences_vs_fp32_*, sequences, blocks_at_limit, block_bytes, bytes_per_token"].startswith(
        "contract")
    assert labels["decode_tokens_per_s"].startswith("physical") and "command: fornax bench serve" in \
        labels["decode_tokens_per_s"]
    json.dumps(report)  # the --json report serializes
