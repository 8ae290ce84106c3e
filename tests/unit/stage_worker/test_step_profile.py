"""The served-step overhead: whole decode steps through a real executor and KV store, less the
layer, embed and head figures measured alone."""

from __future__ import annotations

import pytest

from libs.profiles.measure import Grid, layer_kind
from libs.profiles.schema import Figure, LayerKindProfile
from services.stage_worker.step_profile import measure_step_overhead, parts_decode_s, step_figures, step_grid_figures
from tests.unit.profiles.test_measure import FakeKernels, tiny


def _kind(name: str, at_1: float, at_2: float) -> LayerKindProfile:
    return LayerKindProfile(name, {}, {1: Figure.of([at_1], "s"), 2: Figure.of([at_2], "s")}, 0, 0)


KINDS = {k: _kind(k, 0.001, 0.002) for k in ("dense", "moe", "embed", "head")}


def test_the_parts_of_a_range_are_its_layers_plus_embed_on_the_first_and_head_on_the_last_stage():
    cfg = tiny()
    assert parts_decode_s(KINDS, cfg, 0, 2, True, False, 1) == pytest.approx(0.003)
    assert parts_decode_s(KINDS, cfg, 1, 2, False, True, 2) == pytest.approx(0.004)
    assert {layer_kind(cfg, 0), layer_kind(cfg, 1)} <= set(KINDS)


def test_the_overhead_is_the_served_step_time_less_its_parts_with_kv_at_the_grid_context():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    grid = Grid((4,), (1, 2), decode_contexts=(5,), runs=2, min_run_s=0.02)
    # per batch: warm-up step 0.01 s (so 2 steps a run), then runs of 2 steps lasting 0.02 and 0.03 s
    readings = iter([0.0, 0.01, 1.0, 1.02, 2.0, 2.03] * 2).__next__
    samples = measure_step_overhead(cfg, kernels, 0, 2, True, False, KINDS, grid, readings)
    assert list(samples) == [5]
    assert samples[5][1] == pytest.approx([0.01 - 0.003, 0.015 - 0.003])
    assert samples[5][2] == pytest.approx([0.01 - 0.006, 0.015 - 0.006])
    # every step ran both layers for `batch` rows, each row with its own `context` (and then some) of past
    assert (0, 2, 2 * 5) in kernels.calls and (1, 2, 2 * 5) in kernels.calls
    assert (0, 1, 6) in kernels.calls  # the second step of a run sees the first step's committed KV


def test_the_head_stage_samples_through_the_executor():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    grid = Grid((4,), (2,), decode_contexts=(3,), runs=1, min_run_s=0.0)
    measure_step_overhead(cfg, kernels, 1, 2, False, True, KINDS, grid)
    assert ("final", 2) in kernels.calls


def test_step_figures_pool_every_source_per_batch():
    figures = step_figures([{1: [0.001, 0.003]}, {1: [0.002], 8: [0.01]}])
    assert figures[1].median == pytest.approx(0.002) and figures[1].runs == 3 and figures[1].unit == "s/microbatch"
    assert figures[8].runs == 1


def _kind_by_context(name: str, at_3: float, at_9: float) -> LayerKindProfile:
    by_context = {3: {1: Figure.of([at_3], "s")}, 9: {1: Figure.of([at_9], "s")}}
    return LayerKindProfile(name, {}, by_context[9], 0, 0, by_context)


def test_each_past_of_the_grid_runs_its_own_kv_and_subtracts_the_parts_measured_at_that_past():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    kinds = {"dense": _kind_by_context("dense", 0.001, 0.003), "moe": _kind_by_context("moe", 0.001, 0.003),
             "embed": _kind("embed", 0.001, 0.002)}
    grid = Grid((4,), (1,), decode_contexts=(9, 3), runs=1, min_run_s=0.02)
    # per past: warm-up step 0.01 s (so 2 steps a run), then one run of 2 steps lasting 0.02 s
    readings = iter([0.0, 0.01, 1.0, 1.02] * 2).__next__
    samples = measure_step_overhead(cfg, kernels, 0, 2, True, False, kinds, grid, readings)
    assert list(samples) == [3, 9]  # ascending pasts
    assert samples[3][1] == pytest.approx([0.01 - (0.001 + 0.001 + 0.001)])
    assert samples[9][1] == pytest.approx([0.01 - (0.003 + 0.003 + 0.001)])
    assert (0, 1, 3) in kernels.calls and (0, 1, 9) in kernels.calls


def test_step_grid_figures_pool_every_source_per_past_and_batch():
    figures = step_grid_figures([{32: {1: [0.001, 0.003]}}, {32: {1: [0.002]}, 512: {1: [0.01]}}])
    assert sorted(figures) == [32, 512]
    assert figures[32][1].median == pytest.approx(0.002) and figures[32][1].runs == 3
    assert figures[512][1].runs == 1
