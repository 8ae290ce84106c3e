"""The measurement core: runs and figures from a scripted clock, inputs shaped as the executor
builds them, the profiling cut of a model, and what each layer kind weighs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from libs.model.config import parse_config
from libs.model.kernels import MASK_NEG, LayerOutputs
from libs.model.presets import preset_config
from libs.profiles.link import probe_binding, rows_for
from libs.profiles.measure import (
    Grid,
    InputMaker,
    interleaved_runs,
    kinds_to_measure,
    kv_bytes_per_token,
    layer_resident_bytes,
    measure_head,
    measure_kinds,
    measure_layer,
    profiling_ranges,
    timed_runs,
)
from libs.profiles.schema import DECODE_BATCHES, DECODE_CONTEXTS, PREFILL_LENGTHS


class StepClock:
    """Each reading is the previous one plus the next scripted step."""

    def __init__(self, steps):
        self.now, self.steps = 0.0, list(steps)

    def __call__(self) -> float:
        value = self.now
        if self.steps:
            self.now += self.steps.pop(0)
        return value


def tiny(**overrides):
    return parse_config({**preset_config("tiny", 1, 2), **overrides})


def test_the_default_grid_is_the_published_one():
    grid = Grid()
    assert grid.prefill_lengths == PREFILL_LENGTHS == (16, 128, 512)
    assert grid.decode_batches == DECODE_BATCHES == (1, 8, 32)
    assert grid.decode_contexts == DECODE_CONTEXTS == (32, 128, 512) and grid.context_tokens == 512
    assert grid.runs == 3


def test_timed_runs_sizes_each_run_from_the_warm_up_and_reports_seconds_per_call():
    calls = []
    # warm-up takes 0.01 s -> 0.05 s / 0.01 s = 5 calls per run; runs take 0.05 and 0.10 s
    clock = iter([0.0, 0.01, 1.0, 1.05, 2.0, 2.10]).__next__
    samples = timed_runs(lambda: calls.append(1), runs=2, min_run_s=0.05, clock=clock)
    assert len(calls) == 1 + 2 * 5
    assert samples == pytest.approx([0.01, 0.02])


def test_timed_runs_calls_a_slow_operation_once_per_run():
    calls = []
    clock = iter([0, 1.0, 10, 12, 20, 23, 30, 34]).__next__
    samples = timed_runs(lambda: calls.append(1), runs=3, min_run_s=0.01, clock=clock)
    assert len(calls) == 4 and samples == pytest.approx([2.0, 3.0, 4.0])


def test_interleaved_runs_take_run_r_of_every_figure_before_run_r_plus_one_of_any():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    samples = interleaved_runs(calls, runs=3, min_run_s=0.0, clock=StepClock([0.0] * 100))
    assert order == ["a", "b"] + ["a", "b"] * 3
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}


def test_a_slow_spell_lands_in_one_run_of_each_figure_and_the_medians_stay_clear_of_it():
    """Calls of 1 s and 2 s; the box runs three times slower for two calls in a row. Round-robin,
    the spell is the second run of both figures; one after the other, it would have been two
    runs of one figure, its median slowed threefold."""
    box = {"now": 0.0, "calls": 0}

    def call(cost: float):
        def run():
            slow = box["calls"] in (4, 5)  # after two warm-ups and one round
            box["now"] += cost * (3 if slow else 1)
            box["calls"] += 1
        return run

    samples = interleaved_runs({"a": call(1.0), "b": call(2.0)}, runs=3, min_run_s=0.0, clock=lambda: box["now"])
    assert samples == {"a": pytest.approx([1.0, 3.0, 1.0]), "b": pytest.approx([2.0, 6.0, 2.0])}


def test_prefill_inputs_are_causal_and_decode_inputs_see_only_their_own_past():
    make = InputMaker(tiny())
    prefill = make.prefill(3)
    assert prefill.hidden.shape == (3, 64) and prefill.past_latent.shape == (0, 32)
    assert (prefill.mask == np.triu(np.full((3, 3), MASK_NEG), 1)).all()
    decode = make.decode(2, 4)
    assert decode.hidden.shape == (2, 64) and decode.past_latent.shape == (8, 32) and decode.mask.shape == (2, 10)
    visible = decode.mask == 0
    assert visible[0].tolist() == [True] * 4 + [False] * 4 + [True, False]
    assert visible[1].tolist() == [False] * 4 + [True] * 4 + [False, True]


class FakeKernels:
    name, build = "fake", "fake 1"

    def __init__(self, hidden: int):
        self.hidden, self.calls = hidden, []

    def decoder_layer(self, layer_index, inputs):
        self.calls.append((layer_index, inputs.hidden.shape[0], inputs.past_latent.shape[0]))
        rows = inputs.hidden.shape[0]
        return LayerOutputs(inputs.hidden, np.zeros((rows, 32), np.float32), np.zeros((rows, 16), np.float32), None)

    def embed(self, token_ids):
        return np.zeros((len(token_ids), self.hidden), np.float32)

    def final(self, hidden):
        self.calls.append(("final", hidden.shape[0]))
        return np.zeros((hidden.shape[0], 8), np.float32)


class FakeWeights:
    def __init__(self, layer):
        self._layer = layer
        self.lm_head, self.final_norm = np.zeros((8, 64), np.float32), np.zeros(64, np.float32)

    def layer(self, index):
        return self._layer


@dataclasses.dataclass
class Inner:
    a: np.ndarray
    b: np.ndarray | None


@dataclasses.dataclass
class Outer:
    x: np.ndarray
    inner: Inner
    none: object = None


def test_a_layer_profile_is_timed_per_token_for_prefill_and_per_microbatch_for_decode():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    weights = FakeWeights(Outer(np.zeros(10, np.float32), Inner(np.zeros(5, np.float64), None)))
    grid = Grid((4, 8), (1, 2), decode_contexts=(3,), runs=2, min_run_s=0.0)
    clock = StepClock([0.8] * 100)  # every call "takes" 0.8 s
    profile = measure_layer(cfg, kernels, weights, 1, grid, clock)
    assert profile.kind == "moe" and profile.resident_bytes == 40 + 40
    assert profile.kv_bytes_per_token == kv_bytes_per_token(cfg) == 4 * (32 + 16)
    assert profile.prefill_s_per_token[4].median == pytest.approx(0.2)
    assert profile.prefill_s_per_token[8].median == pytest.approx(0.1)
    assert profile.decode_s_per_microbatch[2].median == pytest.approx(0.8)
    assert all(f.runs == 2 for f in profile.prefill_s_per_token.values())
    # decode rows carry `context` tokens of past each
    assert (1, 2, 6) in kernels.calls and (1, 8, 0) in kernels.calls


def test_decode_is_timed_at_every_past_of_the_context_grid_and_states_the_largest_as_its_plain_figures():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    weights = FakeWeights(Outer(np.zeros(10, np.float32), Inner(np.zeros(5, np.float64), None)))
    grid = Grid((4,), (1, 2), decode_contexts=(7, 3), runs=1, min_run_s=0.0)
    # every figure's warm-up first (a reading and the next step each), then one run each, in
    # order: prefill S=4; past 3: batch 1, 2; past 7: batch 1, 2
    steps = [0.5, 0.0] * 5 + [0.5, 0.0, 0.1, 0.0, 0.3, 0.0, 0.5, 0.0, 0.9, 0.0]
    profile = measure_layer(cfg, kernels, weights, 0, grid, StepClock(steps))
    assert sorted(profile.decode_s_by_context) == [3, 7]
    assert profile.decode_s_by_context[3][1].median == pytest.approx(0.1)
    assert profile.decode_s_by_context[3][2].median == pytest.approx(0.3)
    assert profile.decode_s_by_context[7][2].median == pytest.approx(0.9)
    assert profile.decode_s_per_microbatch == profile.decode_s_by_context[7] and grid.context_tokens == 7
    # each past's rows really carry that past: batch 2 at past 3 reads 6 KV rows, at past 7 reads 14
    assert (0, 2, 6) in kernels.calls and (0, 2, 14) in kernels.calls


def test_a_grid_refuses_no_decode_context():
    with pytest.raises(ValueError, match="decode contexts"):
        Grid(decode_contexts=()).check()


def test_the_head_prefill_costs_one_row_spread_over_the_prompt():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    grid = Grid((4, 16), (2,), runs=1, min_run_s=0.0)
    profile = measure_head(cfg, kernels, FakeWeights(None), grid, StepClock([0.4] * 20))
    assert profile.prefill_s_per_token[4].median == pytest.approx(0.1)
    assert profile.prefill_s_per_token[16].median == pytest.approx(0.025)
    assert ("final", 1) in kernels.calls and ("final", 2) in kernels.calls
    assert profile.kv_bytes_per_token == 0 and profile.resident_bytes == (8 * 64 + 64) * 4


def test_resident_bytes_count_every_array_of_a_layer_once():
    layer = Outer(np.zeros((3, 4), np.float32), Inner(np.zeros(2, np.float32), np.zeros(1, np.float32)))
    assert layer_resident_bytes(layer) == 48 + 8 + 4


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, ((0, 2), (2, 3), (3, 4))),
    ({"num_hidden_layers": 2}, ((0, 2),)),
    ({"num_hidden_layers": 3}, ((0, 2), (2, 3))),
    ({"first_k_dense_replace": 0}, ((0, 1), (1, 3), (3, 4))),
    ({"first_k_dense_replace": 2, "num_hidden_layers": 10}, ((0, 3), (3, 9), (9, 10))),
])
def test_the_profiling_cut_puts_each_kind_in_the_first_range_and_the_head_alone_at_the_end(overrides, expected):
    cfg = tiny(**overrides)
    ranges = profiling_ranges(cfg)
    assert ranges == expected
    assert ranges[0][0] == 0 and ranges[-1][1] == cfg.num_hidden_layers
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def test_each_kind_is_measured_once_on_its_first_layer():
    cfg = tiny(num_hidden_layers=6, first_k_dense_replace=2)
    assert kinds_to_measure(cfg, 0, 6) == {"dense": 0, "moe": 2}
    assert kinds_to_measure(cfg, 3, 6, frozenset({"moe"})) == {}
    assert kinds_to_measure(cfg, 1, 3, frozenset({"dense"})) == {"moe": 2}


def test_the_probe_binding_is_derived_from_the_probe_id_alone():
    a, b = probe_binding("6f1e9a52-8a3c-4f4b-9d53-0b0d9c3f8b1a"), probe_binding("6f1e9a52-8a3c-4f4b-9d53-0b0d9c3f8b1a")
    assert a == b and a.plan_hash.startswith("sha256:") and a.stage_id == "link-probe"
    assert probe_binding("0e1b1d9c-1111-4222-8333-444455556666") != a
    with pytest.raises(ValueError):
        probe_binding("probe-1")
    assert rows_for(32 * 1024) == 8 and rows_for(16 * 1024 * 1024) == 4096


def test_a_ranges_kinds_and_head_are_measured_in_one_interleaved_pass():
    """Two layer kinds and the head of one profiled range: every figure warm first, then the
    first run of each before the second run of any, so dense and MoE are timed side by side."""
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    weights = FakeWeights(Outer(np.zeros(10, np.float32), Inner(np.zeros(5, np.float64), None)))
    grid = Grid((4,), (2,), decode_contexts=(3,), runs=2, min_run_s=0.0)
    profiles = measure_kinds(cfg, kernels, weights, {"dense": 0, "moe": 1}, False, True, grid,
                             StepClock([0.2, 0.0] * 100))
    assert sorted(profiles) == ["dense", "head", "moe"]
    assert profiles["moe"].kind == "moe" and profiles["dense"].decode_s_by_context[3][2].runs == 2
    assert profiles["head"].prefill_s_per_token[4].median == pytest.approx(0.05)
    one_pass = [(0, 4, 0), (0, 2, 6), (1, 4, 0), (1, 2, 6), ("final", 1), ("final", 2)]
    assert kernels.calls == one_pass * 3  # warm-ups, then run 1, then run 2


def test_a_range_without_the_head_is_refused_before_anything_is_timed():
    cfg = tiny()
    kernels = FakeKernels(cfg.hidden_size)
    weights = FakeWeights(None)
    weights.lm_head = None
    with pytest.raises(ValueError, match="no head"):
        measure_kinds(cfg, kernels, weights, {"dense": 0}, False, True, Grid((4,), (2,), runs=1, min_run_s=0.0))
    assert kernels.calls == []
