"""The drift core: sustained versus transient excursions, hysteresis, missing predictions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.orchestrator.engine.drift import (
    Calibration,
    DriftPolicy,
    DriftTracker,
    MeasuredService,
    prediction_basis,
)

POLICY = DriftPolicy(relative_bound=0.5, sustain_rounds=3, recover_rounds=3, recover_fraction=0.8,
                     min_microbatches=4)


class Feed:
    """Reports with a rising microbatch counter, one per round."""

    def __init__(self, stages: int) -> None:
        self.totals = [0] * stages

    def round(self, *service_s: float | None, window: int = 16) -> list[MeasuredService | None]:
        out: list[MeasuredService | None] = []
        for i, value in enumerate(service_s):
            if value is None:
                out.append(None)
                continue
            self.totals[i] += window
            out.append(MeasuredService(self.totals[i], value, window, 4.0))
        return out


def test_sustained_excursion_marks_the_route_uncalibrated_with_both_figures():
    tracker, feed = DriftTracker((0.010, 0.020), prediction_basis("exploratory"), POLICY), Feed(2)
    for _ in range(2):
        assert tracker.observe(feed.round(0.010, 0.060)).state is not Calibration.UNCALIBRATED
    verdict = tracker.observe(feed.round(0.010, 0.060))
    assert verdict.state is Calibration.UNCALIBRATED
    assert [s.state for s in verdict.stages] == [Calibration.CALIBRATED, Calibration.UNCALIBRATED]
    assert "stage 1: plan predicted 0.02 s, measured 0.06 s over 16 microbatches" in verdict.reason
    assert "exploratory plan" in verdict.reason and "stage 0" not in verdict.reason
    assert verdict.stages[1].relative_error == pytest.approx(2.0)


def test_transient_excursions_never_mark_it():
    tracker, feed = DriftTracker((0.010,), "basis", POLICY), Feed(1)
    assert tracker.observe(feed.round(0.5)).state is Calibration.UNMEASURED
    for _ in range(10):
        for _ in range(3):
            tracker.observe(feed.round(0.011))
        assert tracker.observe(feed.round(0.5)).state is Calibration.CALIBRATED  # a bad round now and then
        assert tracker.observe(feed.round(0.5)).state is Calibration.CALIBRATED


def test_faster_than_predicted_is_outside_the_bound_too():
    tracker, feed = DriftTracker((0.010,), "basis", POLICY), Feed(1)
    for _ in range(3):
        verdict = tracker.observe(feed.round(0.004))
    assert verdict.state is Calibration.UNCALIBRATED


def test_recovery_needs_sustained_rounds_well_inside_the_bound():
    tracker, feed = DriftTracker((0.010,), "basis", POLICY), Feed(1)
    for _ in range(3):
        tracker.observe(feed.round(0.030))
    # Just inside the bound (error 0.45 > 0.8 * 0.5): hysteresis keeps it uncalibrated.
    for _ in range(6):
        assert tracker.observe(feed.round(0.0145)).state is Calibration.UNCALIBRATED
    tracker.observe(feed.round(0.011))
    assert tracker.observe(feed.round(0.011)).state is Calibration.UNCALIBRATED
    assert tracker.observe(feed.round(0.011)).state is Calibration.CALIBRATED


def test_repeated_reports_of_the_same_window_are_not_new_evidence():
    tracker, feed = DriftTracker((0.010,), "basis", POLICY), Feed(1)
    stale = feed.round(0.060)
    for _ in range(10):
        verdict = tracker.observe(stale)
    assert verdict.state is Calibration.UNMEASURED


def test_missing_prediction_is_never_calibrated():
    for missing in (None, 0.0, float("nan"), float("inf"), -1.0):
        tracker, feed = DriftTracker((0.010, missing), "basis", POLICY), Feed(2)
        for _ in range(5):
            verdict = tracker.observe(feed.round(0.010, 0.010))
        assert verdict.state is Calibration.NO_PREDICTION
        assert verdict.stages[1].state is Calibration.NO_PREDICTION
        assert "stage 1: no prediction, measured 0.01 s" in verdict.reason


def test_unmeasured_until_enough_microbatches_and_unreadable_stages_change_nothing():
    tracker, feed = DriftTracker((0.010,), "basis", POLICY), Feed(1)
    for _ in range(5):
        assert tracker.observe(feed.round(0.010, window=2)).state is Calibration.UNMEASURED
        assert tracker.observe(feed.round(None)).state is Calibration.UNMEASURED
    assert "not measured" not in tracker.calibration.reason  # it was measured, just too little


def test_no_stage_is_calibrated_before_any_report():
    verdict = DriftTracker((0.010, 0.020), "basis", POLICY).calibration
    assert verdict.state is Calibration.UNMEASURED
    assert "not measured yet" in verdict.reason


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        DriftPolicy(relative_bound=0)
    with pytest.raises(ValueError):
        DriftPolicy(recover_fraction=1.5)


def _run_of_three(flags: list[bool]) -> bool:
    return any(all(flags[i:i + 3]) for i in range(len(flags) - 2))


@given(st.lists(st.floats(min_value=1e-4, max_value=1.0), min_size=1, max_size=40),
       st.floats(min_value=1e-3, max_value=0.1))
def test_each_verdict_rests_on_three_rounds_in_a_row(values, predicted):
    tracker, feed = DriftTracker((predicted,), "basis", POLICY), Feed(1)
    outside: list[bool] = []
    well_inside: list[bool] = []
    for value in values:
        state = tracker.observe(feed.round(value)).stages[0].state
        error = abs(value - predicted) / predicted
        outside.append(error > 0.5)
        well_inside.append(error <= 0.4)
        if state is Calibration.UNCALIBRATED:
            assert _run_of_three(outside) and not (len(well_inside) >= 3 and all(well_inside[-3:]))
        elif state is Calibration.CALIBRATED:
            assert _run_of_three(well_inside) and not (len(outside) >= 3 and all(outside[-3:]))
        else:
            assert state is Calibration.UNMEASURED
            assert not _run_of_three(outside) and not _run_of_three(well_inside)


def test_calibration_reaches_plan_status_and_the_dashboard_with_each_figure_labelled():
    from fornax.orchestrator.v1 import orchestrator_pb2 as pb
    from services.orchestrator.api.dashboard_state import calibration_view
    from services.orchestrator.convert import calibration_to_pb

    tracker, feed = DriftTracker((0.010, None), prediction_basis("deployment", True, 0), POLICY), Feed(2)
    for _ in range(3):
        verdict = tracker.observe(feed.round(0.030, 0.010))
    message = calibration_to_pb(verdict)
    assert message.state == pb.CALIBRATION_STATE_UNCALIBRATED and message.relative_bound == 0.5
    assert [s.state for s in message.stages] == [pb.CALIBRATION_STATE_UNCALIBRATED, pb.CALIBRATION_STATE_NO_PREDICTION]
    assert message.stages[0].predicted_decode_service_s == 0.010
    assert message.stages[0].measured_decode_service_s == 0.030 and message.stages[0].measured_microbatches == 16
    assert message.stages[1].predicted_decode_service_s == 0.0  # none, not a zero-second prediction
    assert "evidence-backed deployment plan" in message.prediction_basis
    view = calibration_view(verdict)
    assert view["state"] == "uncalibrated" and view["stages"][1]["predicted_decode_service_s"] is None
    assert view["stages"][0]["relative_error"] == pytest.approx(2.0)


def test_stage_worker_service_times_keep_a_rolling_decode_window():
    from services.stage_worker.service_times import RECENT_DECODE_MICROBATCHES, ServiceTimes

    times = ServiceTimes()
    assert times.recent_decode().microbatches == 0
    for _ in range(RECENT_DECODE_MICROBATCHES):
        times.observe_decode(0.001, 2)
    for _ in range(RECENT_DECODE_MICROBATCHES):
        times.observe_decode(0.003, 4)
    times.observe_prefill(0.5, 100)
    recent = times.recent_decode()
    assert recent.microbatches == RECENT_DECODE_MICROBATCHES and recent.mean_service_ns == 3_000_000
    assert recent.mean_rows == 4.0
    assert times.decode_microbatches == 2 * RECENT_DECODE_MICROBATCHES
    assert times.decode_service_ns == RECENT_DECODE_MICROBATCHES * 4_000_000
    assert (times.prefill_tokens, times.prefill_batches) == (100, 1)
    assert times.decode_past_tokens == 0  # no past given


def test_stage_worker_service_times_count_the_past_its_decode_rows_attended_over():
    from services.stage_worker.convert import _service_to_pb
    from services.stage_worker.service_times import ServiceTimes

    times = ServiceTimes()
    times.observe_decode(0.001, 2, past_tokens=16 + 17)
    times.observe_decode(0.001, 1, past_tokens=40)
    assert times.decode_past_tokens == 73 and times.decode_rows == 3
    reply = _service_to_pb(times)
    assert reply is not None and reply.decode_past_tokens / reply.decode_rows == pytest.approx(73 / 3)


def test_fornax_status_renders_the_calibration_line():
    from apps.fleet.route_status import RouteReport

    report = RouteReport("SERVING", "", {"stage_worker_0": "READY"}, "UNCALIBRATED",
                         "uncalibrated (stage 1: plan predicted 0.001 s, measured 0.02 s over 32 microbatches)")
    assert report.healthy  # slow is not down
    assert report.render().endswith("calibration: UNCALIBRATED: uncalibrated (stage 1: plan predicted 0.001 s, "
                                    "measured 0.02 s over 32 microbatches)")
    assert "calibration" not in RouteReport("SERVING", "", {}).render()


def test_the_prediction_basis_tells_declared_figures_from_evidence():
    assert prediction_basis("exploratory").startswith("exploratory plan: predictions from declared figures")
    assert prediction_basis("deployment", True, 0).startswith("evidence-backed deployment plan")
    assert "2 term(s) from declared figures" in prediction_basis("exploratory", True, 2)
