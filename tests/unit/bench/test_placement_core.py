"""The pure part of `fornax bench placement`: fits, the calibrated split, the reported ratios."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.bench.placement_core import (
    HostFit,
    StageSample,
    bottleneck_prediction_error,
    calibrated_ranges,
    fit_host,
    predicted_stage_s,
    ranges_of,
    tok_s_ratio,
    warmup_splits,
)


def _fit(per_layer: float, fixed: float) -> HostFit:
    return HostFit(per_layer, fixed, ())


def test_fit_recovers_per_layer_and_fixed_terms():
    fit = fit_host((StageSample(1, 0.012), StageSample(5, 0.032)))
    assert fit.per_layer_s == pytest.approx(0.005) and fit.fixed_s == pytest.approx(0.007)
    assert fit.predict(3) == pytest.approx(0.022)


def test_fit_never_goes_negative_and_needs_two_layer_counts():
    flat = fit_host((StageSample(1, 0.02), StageSample(5, 0.01)))  # noise: more layers measured faster
    assert flat.per_layer_s == 0 and flat.fixed_s == pytest.approx(0.015)
    through_zero = fit_host((StageSample(1, 0.001), StageSample(5, 0.02)))
    assert through_zero.fixed_s == 0 and through_zero.per_layer_s > 0
    with pytest.raises(ValueError):
        fit_host((StageSample(2, 0.01), StageSample(2, 0.02)))


def test_the_slower_host_gets_fewer_layers():
    fast, slow = _fit(0.001, 0.002), _fit(0.005, 0.002)
    ranges = calibrated_ranges((fast, slow), 6, hop_s=0.0)
    assert ranges == [(0, 5), (5, 6)]
    assert calibrated_ranges((slow, fast), 6, hop_s=0.0) == [(0, 1), (1, 6)]  # order kept, slow one first


def test_equal_hosts_split_evenly():
    same = _fit(0.002, 0.0)
    assert calibrated_ranges((same, same), 6, hop_s=0.0) == [(0, 3), (3, 6)]


@given(st.floats(1e-4, 1e-1), st.floats(1e-4, 1e-1), st.floats(0, 1e-2), st.floats(0, 1e-2),
       st.integers(3, 24))
def test_calibrated_split_is_contiguous_and_never_worse_than_even(a, b, fa, fb, layers):
    fits = (_fit(a, fa), _fit(b, fb))
    ranges = calibrated_ranges(fits, layers, hop_s=0.0)
    assert ranges[0][0] == 0 and ranges[0][1] == ranges[1][0] and ranges[1][1] == layers
    assert all(end > start for start, end in ranges)
    half = layers // 2
    even = [(0, half), (half, layers)]
    assert max(predicted_stage_s(fits, ranges)) <= max(predicted_stage_s(fits, even)) + 1e-12


def test_errors_and_ratios():
    assert bottleneck_prediction_error([0.010, 0.020], [0.012, 0.025]) == pytest.approx(0.2)
    assert bottleneck_prediction_error([0.030, 0.020], [0.012, 0.025]) == pytest.approx(0.2)
    assert tok_s_ratio(130.0, 100.0) == pytest.approx(1.3)
    with pytest.raises(ValueError):
        tok_s_ratio(1.0, 0.0)
    with pytest.raises(ValueError):
        bottleneck_prediction_error([0.1], [0.0])


def test_warmup_splits_put_each_host_at_one_and_all_but_one_layer():
    assert warmup_splits(6) == ((1, 5), (5, 1))
    assert ranges_of((1, 5)) == [(0, 1), (1, 6)]
    with pytest.raises(ValueError):
        warmup_splits(2)
