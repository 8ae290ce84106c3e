"""Decode predicted over the profile's measured pasts as well as its rows: attention reads
rows x past, so a host whose decode is dominated by attention is cheap at a short context."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.profiles.schema import LayerKindProfile, StageProfile, stage_profile_from_json, to_json
from services.planner.inventory import Target
from services.planner.measured import interpolate_grid
from services.planner.planner import plan
from services.planner.profiles import book_from_records
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import NOW, fig, link_profile, link_record, stage_profile, stage_record

MODEL = tiny_model(layers=12)
SNAP = MODEL.model_snapshot
TWO = Target(context_tokens=512, concurrency=4, min_stages=2, max_stages=2, prefill_tokens=64)


def test_interpolate_grid_is_linear_in_rows_then_in_past_with_the_end_segments_beyond():
    grid = {32: {1: fig(1.0), 8: fig(2.0)}, 512: {1: fig(5.0), 8: fig(10.0)}}
    assert interpolate_grid(grid, 1, 32) == pytest.approx(1.0)
    assert interpolate_grid(grid, 4.5, 32) == pytest.approx(1.5)
    assert interpolate_grid(grid, 1, 272) == pytest.approx(3.0)  # halfway between the pasts
    assert interpolate_grid(grid, 8, 272) == pytest.approx(6.0)
    assert interpolate_grid(grid, 1, 992) == pytest.approx(9.0)  # the last segment's slope beyond 512
    assert interpolate_grid(grid, 1, 8) == pytest.approx(1.0)  # never below the shortest past's figure
    assert interpolate_grid({512: grid[512]}, 1, 32) == pytest.approx(5.0)  # one past stands for every past
    with pytest.raises(ValueError):
        interpolate_grid({}, 1, 32)


def _attention_bound(profile: StageProfile, at_past_32: float, at_past_512: float) -> StageProfile:
    """The dense and MoE kinds (and the step) grow from `at_past_32` to `at_past_512` seconds per
    layer at one row; rows scale both as the factory does (x2 at 8, x5 at 32)."""
    def table(one: float):
        return {1: fig(one), 8: fig(one * 2), 32: fig(one * 5)}

    def grown(k: LayerKindProfile) -> LayerKindProfile:
        if k.kind in ("embed", "head"):
            return k
        by_context = {32: table(at_past_32), 128: table(at_past_32 + (at_past_512 - at_past_32) * 96 / 480),
                      512: table(at_past_512)}
        return replace(k, decode_s_per_microbatch=by_context[512], decode_s_by_context=by_context)
    return replace(profile, kinds=tuple(grown(k) for k in profile.kinds), context_tokens=512)


def _records():
    # a: attention-bound, 0.5 ms a layer at past 32 but 4 ms at past 512; b: 2 ms at every past.
    a = _attention_bound(stage_profile("a", SNAP), 0.5e-3, 4e-3)
    b = stage_profile("b", SNAP, layer_s=2e-3)
    return [stage_record(a), stage_record(b), link_record(link_profile("a", "b"))]


def _plan(target: Target):
    return plan(MODEL, full_mesh(node("a"), node("b")), target, profiles=book_from_records(_records()),
                now_unix_ns=NOW).plan


def _layers(p, name: str) -> int:
    return sum(s.layer_end - s.layer_start for s in p.stages if s.node == name)


def test_a_context_dominated_host_gets_more_layers_at_a_short_context():
    long = _plan(replace(TWO, decode_context_tokens=512))
    short = _plan(replace(TWO, decode_context_tokens=32))
    assert _layers(long, "a") < _layers(long, "b")  # 4 ms a layer against 2 ms
    assert _layers(short, "a") > _layers(short, "b")  # 0.5 ms a layer against 2 ms
    assert _layers(short, "a") >= _layers(long, "a") + 4


def test_the_plan_states_the_past_it_predicts_at_defaulting_to_the_configured_context():
    default = _plan(TWO)
    stated = {p.name: p.value for p in default.predictions}
    assert stated["decode_context_tokens"] == 512 == TWO.context_tokens
    short = _plan(replace(TWO, decode_context_tokens=40))
    assert {p.name: p.value for p in short.predictions}["decode_context_tokens"] == 40
    compute = next(t for t in short.stages[0].terms if t.term == "compute")
    assert "at 40 tokens of past per row (the target's decode context)" in compute.note
    compute = next(t for t in default.stages[0].terms if t.term == "compute")
    assert "at 512 tokens of past per row (the target's configured context)" in compute.note


def test_a_stage_at_an_unmeasured_past_interpolates_its_layers_and_step():
    target = replace(TWO, decode_context_tokens=80, decode_microbatch_rows=1)
    p = _plan(target)
    a = next(s for s in p.stages if s.node == "a")
    layers = a.layer_end - a.layer_start
    per_layer = 0.5e-3 + (4e-3 - 0.5e-3) * 96 / 480 * (80 - 32) / (128 - 32)
    step = 1e-4  # the factory's step: one past only, 0.1 ms at one row, stands for every past
    edge = 1e-4  # embed or head at one row
    assert a.decode.compute_s == pytest.approx(per_layer * layers + edge + step)


def test_a_profile_without_the_context_grid_reads_back_at_its_one_context():
    old = stage_profile("a", SNAP)
    assert old.kinds[0].decode_s_by_context == {} and old.step_s_by_context == {}
    parsed = stage_profile_from_json(to_json(old))
    assert parsed == old
    assert parsed.decode_grid(parsed.kinds[0]) == {4096: parsed.kinds[0].decode_s_per_microbatch}
    assert parsed.step_grid() == {4096: parsed.step_s_per_microbatch} and parsed.decode_contexts == (4096,)
    grown = _attention_bound(old, 1e-3, 2e-3)
    again = stage_profile_from_json(to_json(grown))
    assert again == grown and again.decode_contexts == (32, 128, 512)
