"""Weight-read accounting for `bench stage --weights`: a decode step reads the dense part and each
routed expert its rows touch once, and the report relates bytes per second to the triad."""

from __future__ import annotations

import pytest

from apps.bench.stage_layers import WeightRead, triad_ratios
from libs.model.bandwidth import decode_read_bytes, expected_distinct_experts, triad


def test_one_row_touches_top_k_experts_and_many_rows_touch_nearly_all():
    assert expected_distinct_experts(64, 6, 1) == pytest.approx(6)
    assert expected_distinct_experts(64, 6, 32) == pytest.approx(64 * (1 - (58 / 64) ** 32))
    assert 60 < expected_distinct_experts(64, 6, 64) < 64
    assert decode_read_bytes(1000, 10, 0, 0, 8) == 1000  # a dense layer reads all of itself
    assert decode_read_bytes(1000, 10, 64, 6, 1) == pytest.approx(1060)


def test_triad_counts_five_arrays_per_pass_and_is_positive():
    measured = triad(elements=1 << 16, repeats=2, threads=2)
    assert measured.bytes_per_pass == 5 * 8 * (1 << 16) and measured.bytes_per_s > 0 and measured.threads == 2


def test_ratios_average_layers_per_backend_and_batch():
    reads = [WeightRead("max", "decode batch=1", 0, "dense", 1e6, 2e9),
             WeightRead("max", "decode batch=1", 1, "moe", 1e6, 4e9),
             WeightRead("numpy", "decode batch=8", 0, "dense", 1e6, 1e9)]
    assert triad_ratios(reads, 10e9) == {"weight_read_vs_triad_decode1_max": 0.3,
                                         "weight_read_vs_triad_decode8_numpy": 0.1}


def test_policy_ratios_compare_a_backend_with_its_own_fp32_run():
    from apps.bench.stage_layers import BenchRow, policy_ratios

    rows = [BenchRow("decode batch=1", "max", 0, "dense", 1.0, 1.0),
            BenchRow("decode batch=1", "max", 1, "moe", 3.0, 3.0),
            BenchRow("decode batch=1", "max:fp32", 0, "dense", 4.0, 4.0),
            BenchRow("decode batch=1", "max:fp32", 1, "moe", 8.0, 8.0),
            BenchRow("decode batch=1", "numpy", 0, "dense", 1.0, 1.0)]
    assert policy_ratios(rows, "q4_k_m") == {"q4_k_m_vs_fp32_decode_batch1_max": 3.0}
    assert policy_ratios(rows, "fp32") == {}
