"""The gate compares the plan's predictions at the rows per microbatch it actually measured."""

from __future__ import annotations

import pytest

from apps.qualify.gate import CHECKS, PHASES, Check, PredictedStage, RunOutcome, StageTimes, calibrate
from apps.qualify.predict_at import ROWS_BASIS, answer_halves, planner_at, predicted_at_rows, row_bounds
from libs.profiles.schema import calibration_from_json, to_json
from services.planner.profiles import book_from_records
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import NOW, fig, link_profile, link_record, stage_profile, stage_record

MODEL = tiny_model(layers=12)
SNAP = MODEL.model_snapshot
PLACEMENT = [("a", 0, 8), ("b", 8, 12)]


def _at(past: float = 0.0, a_profile=None):
    book = book_from_records([stage_record(a_profile or stage_profile("a", SNAP)),
                              stage_record(stage_profile("b", SNAP)), link_record(link_profile("a", "b"))])
    return planner_at(MODEL, full_mesh(node("a"), node("b")), book, PLACEMENT, NOW, past)


def _installed(target_rows_compute: float = 1.0) -> list[PredictedStage]:
    seconds = dict.fromkeys(PHASES, 0.0) | {"compute": target_rows_compute}
    return [PredictedStage(i, h, "max", a, b, seconds) for i, (h, a, b) in enumerate(PLACEMENT)]


def test_row_bounds_split_a_measured_mean_into_whole_rows_either_side():
    assert row_bounds(1.3) == (1, 2, pytest.approx(0.3))
    assert row_bounds(8.0) == (8, 9, 0.0)
    assert row_bounds(0.4) == (1, 2, 0.0)  # a microbatch holds at least one row


def test_whole_measured_rows_give_the_planners_own_prediction_at_those_rows():
    at = _at()
    got = predicted_at_rows(_installed(), [8.0, 8.0], at)
    plan8 = at(8)
    for stage, planned in zip(got, plan8.stages, strict=True):
        assert stage.rows == 8.0
        assert stage.seconds["compute"] == pytest.approx(planned.decode.compute_s)
        assert stage.seconds["wire"] == pytest.approx(planned.decode.wire_s)
    # 8 dense/moe layers at 2 ms (the factory's 8-row figure), embed 0.2 ms, step 0.2 ms.
    assert got[0].seconds["compute"] == pytest.approx(8 * 2e-3 + 2e-4 + 2e-4)


def test_fractional_rows_blend_the_predictions_either_side_and_differ_from_the_target_rows():
    at = _at()
    one, two = at(1), at(2)
    got = predicted_at_rows(_installed(target_rows_compute=1.0), [1.25, 1.75], at)
    for stage, share in zip(got, (0.25, 0.75), strict=True):
        lo, hi = one.stages[stage.stage_index].decode, two.stages[stage.stage_index].decode
        assert stage.seconds["compute"] == pytest.approx(lo.compute_s + share * (hi.compute_s - lo.compute_s))
        assert stage.seconds["compute"] < 1.0  # not the installed (target rows) figure


def test_a_row_figure_per_stage_is_required():
    with pytest.raises(ValueError, match="2 stages"):
        predicted_at_rows(_installed(), [1.0], _at())


def test_the_calibration_record_states_the_rows_its_predictions_were_evaluated_at():
    predicted = predicted_at_rows(_installed(), [1.5, 1.5], _at())
    measured = {s.stage_index: s.service_s for s in predicted}
    checks = tuple(Check(n, True, "ok") for n in CHECKS)
    stages = tuple(StageTimes(p.stage_index, p.host, "max", p.layer_start, p.layer_end, 30, 1.5,
                              dict.fromkeys(PHASES, 0.0) | {"compute": measured[p.stage_index]}) for p in predicted)
    verdict = calibrate([RunOutcome(1, checks, stages)], predicted, model_snapshot=SNAP, plan_hash="sha256:00",
                        rows_basis=ROWS_BASIS)
    c = calibration_from_json(to_json(verdict.calibration))
    assert c.rows_basis == ROWS_BASIS and [s.rows for s in c.stages] == [1.5, 1.5]
    assert c.bottleneck_prediction_error == pytest.approx(0.0) and verdict.passed
    assert any("measured rows per microbatch" in line for line in verdict.describe())


def test_the_gates_wire_prediction_adds_the_answers_half_of_the_measured_round_trip():
    book = book_from_records([stage_record(stage_profile("a", SNAP)), stage_record(stage_profile("b", SNAP)),
                              link_record(link_profile("a", "b", rtt_s=4e-3))])
    answers = answer_halves(book, ["a", "b"])
    assert answers == [pytest.approx(2e-3), 0.0]  # the last stage sends nothing on
    at = _at()
    one_way = predicted_at_rows(_installed(), [2.0, 2.0], at)
    round_trip = predicted_at_rows(_installed(), [2.0, 2.0], at, answers)
    assert round_trip[0].seconds["wire"] == pytest.approx(one_way[0].seconds["wire"] + 2e-3)
    assert round_trip[1].seconds["wire"] == one_way[1].seconds["wire"] == 0.0
    assert round_trip[0].seconds["compute"] == one_way[0].seconds["compute"]


def test_the_measured_past_re_predicts_at_that_past_and_is_stated_on_every_stage_and_in_the_record():
    from dataclasses import replace

    a = stage_profile("a", SNAP)
    by_context = {32: {r: fig(1e-3 * m) for r, m in ((1, 1), (8, 2), (32, 5))},
                  512: {r: fig(4e-3 * m) for r, m in ((1, 1), (8, 2), (32, 5))}}
    attention_bound = replace(a, context_tokens=512, kinds=tuple(
        replace(k, decode_s_per_microbatch=by_context[512], decode_s_by_context=by_context)
        if k.kind in ("dense", "moe") else k for k in a.kinds))
    short = predicted_at_rows(_installed(), [1.0, 1.0], _at(32, attention_bound), past=32)
    long = predicted_at_rows(_installed(), [1.0, 1.0], _at(512, attention_bound), past=512)
    # stage 0 (8 layers on a): 1 ms a layer at past 32, 4 ms at past 512; embed and step 0.1 ms each
    assert short[0].seconds["compute"] == pytest.approx(8 * 1e-3 + 2e-4)
    assert long[0].seconds["compute"] == pytest.approx(8 * 4e-3 + 2e-4)
    assert short[1].seconds["compute"] == pytest.approx(long[1].seconds["compute"])  # b measured one past only
    assert [s.past for s in short] == [32, 32]
    checks = tuple(Check(n, True, "ok") for n in CHECKS)
    stages = tuple(StageTimes(p.stage_index, p.host, "max", p.layer_start, p.layer_end, 30, 1.0,
                              dict.fromkeys(PHASES, 0.0) | {"compute": p.service_s}, 32.0) for p in short)
    verdict = calibrate([RunOutcome(1, checks, stages)], short, model_snapshot=SNAP, plan_hash="sha256:00",
                        rows_basis=ROWS_BASIS)
    c = calibration_from_json(to_json(verdict.calibration))
    assert [s.past_tokens for s in c.stages] == [32.0, 32.0]
    assert any("32 tokens of past per row" in line for line in verdict.describe())
