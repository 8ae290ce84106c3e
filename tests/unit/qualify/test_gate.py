"""The gate's pure core: failures by check and run, the calibration verdict, phase windows,
clock offsets, and the report's charts."""

from __future__ import annotations

import re

import pytest

from apps.fleet.spec import parse_fleet_spec
from apps.qualify.gate import (
    CHECKS,
    PHASES,
    BoundaryParity,
    Check,
    PredictedStage,
    RunOutcome,
    StageTimes,
    calibrate,
    failure_lines,
)
from apps.qualify.phases import PhaseSnapshot, WindowError, stage_times
from apps.qualify.records import MeasuredOn, calibration_record, qualification_record, run_measurement
from apps.qualify.report_html import ReportFacts, render_report
from apps.qualify.skew import describe, skewed_offsets, with_offsets
from libs.common.kinds import DType
from libs.profiles.schema import RouteStage, calibration_from_json, route_key, to_json
from services.evidence_registry.domain import EvidenceClass, LayerRange, RecordType

SNAPSHOT = "sha256:" + "ab" * 32


def _times(index: int, compute: float, wire: float = 0.001) -> StageTimes:
    seconds = dict.fromkeys(PHASES, 0.0) | {"compute": compute, "pack": 0.0005, "wire": wire, "unpack": 0.0005}
    return StageTimes(index, ("alpha", "beta")[index], "numpy", (0, 3)[index], (3, 4)[index], 40, 4.0, seconds)


def _predicted(compute0: float, compute1: float) -> list[PredictedStage]:
    def one(i, compute):
        seconds = dict.fromkeys(PHASES, 0.0) | {"compute": compute, "pack": 0.0005, "wire": 0.001, "unpack": 0.0005}
        return PredictedStage(i, ("alpha", "beta")[i], "numpy", (0, 3)[i], (3, 4)[i], seconds)
    return [one(0, compute0), one(1, compute1)]


def _all_pass(run: int, compute1: float = 0.010, **fail: str) -> RunOutcome:
    checks = tuple(Check(n, n not in fail, fail.get(n, "ok")) for n in CHECKS)
    boundaries = (BoundaryParity("stage 0 [0,3) hidden after layer 2", 2e-6, 1e-4),
                  BoundaryParity("final logits", 3e-6, 1e-4))
    return RunOutcome(run, checks, (_times(0, 0.004), _times(1, compute1)), boundaries)


def test_a_failed_check_is_named_with_its_run():
    runs = [_all_pass(1), _all_pass(2, cancellation="the cancelled stream ended normally, not CANCELLED")]
    assert failure_lines(runs) == ("run 2: cancellation: the cancelled stream ended normally, not CANCELLED",)


def test_a_check_a_run_never_reported_fails_as_not_run():
    run = RunOutcome(1, (Check("prefill", True, "ok"),), (_times(0, 0.004), _times(1, 0.01)))
    lines = failure_lines([run])
    assert "run 1: cleanup: not run" in lines and len(lines) == len(CHECKS) - 1


def test_calibration_passes_within_tolerance_and_states_its_spread():
    runs = [_all_pass(1, 0.010), _all_pass(2, 0.011), _all_pass(3, 0.009)]
    verdict = calibrate(runs, _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="sha256:00")
    c = verdict.calibration
    assert verdict.passed and c.runs == 3 and c.tolerance == 0.25
    assert c.measured_bottleneck_s.median == pytest.approx(0.012)  # compute + pack + wire + unpack of beta
    assert c.measured_bottleneck_s.low == pytest.approx(0.011) and c.measured_bottleneck_s.high == pytest.approx(0.013)
    assert c.bottleneck_prediction_error == pytest.approx(abs(0.012 - 0.0125) / 0.012)
    assert c.route_key == route_key(SNAPSHOT, [RouteStage("alpha", "numpy", 0, 3), RouteStage("beta", "numpy", 3, 4)])
    assert "tolerance 25%" in verdict.describe()[0] and "(prediction)" in verdict.describe()[0]


def test_calibration_fails_outside_tolerance_even_when_every_check_passed():
    verdict = calibrate([_all_pass(1, 0.010)], _predicted(0.004, 0.004), model_snapshot=SNAPSHOT, plan_hash="h")
    assert not verdict.passed and verdict.failures == ()
    assert verdict.calibration.bottleneck_prediction_error > 0.25


def test_a_failed_check_fails_the_gate_whatever_the_calibration():
    verdict = calibrate([_all_pass(1), _all_pass(2, cleanup="stage 1 still holds 4096 KV bytes")],
                        _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="h", tolerance=10.0)
    assert not verdict.passed
    assert verdict.failures == ("run 2: cleanup: stage 1 still holds 4096 KV bytes",)
    assert any(line.startswith("FAILED run 2: cleanup") for line in verdict.describe())


def test_a_run_without_phase_times_fails_the_gate():
    run = RunOutcome(1, _all_pass(1).checks, ())
    verdict = calibrate([run], _predicted(0.004, 0.01), model_snapshot=SNAPSHOT, plan_hash="h", tolerance=10.0)
    assert not verdict.passed and verdict.failures[0].startswith("run 1: measurement:")


def test_phase_window_divides_by_batches_and_exposes_unexplained_wait():
    before = PhaseSnapshot(queue_ns=0, compute_ns=1_000_000, pack_ns=0, transfer_ns=0, unpack_ns=0, batches=10)
    after = PhaseSnapshot(queue_ns=10_000_000, compute_ns=41_000_000, pack_ns=2_000_000, transfer_ns=8_000_000,
                          unpack_ns=4_000_000, batches=30)
    t = stage_times(before, after, 2.0, stage_index=1, host="beta", backend="numpy", layer_start=3, layer_end=4,
                    rows=80)
    assert t.batches == 20 and t.rows_per_batch == 4.0
    assert t.seconds["compute"] == pytest.approx(0.002) and t.seconds["wire"] == pytest.approx(0.0004)
    assert t.seconds["queue"] == pytest.approx(0.0005)
    explained = 0.002 + 0.0001 + 0.0004 + 0.0002 + 0.0005
    assert t.seconds["exposed_wait"] == pytest.approx(0.1 - explained)
    assert t.service_s == pytest.approx(0.002 + 0.0001 + 0.0004 + 0.0002)
    assert t.past_per_row == 0.0  # no past counted: not measured
    with_past = stage_times(before, after, 2.0, stage_index=1, host="beta", backend="numpy", layer_start=3,
                            layer_end=4, rows=80, past_tokens=80 * 37)
    assert with_past.past_per_row == pytest.approx(37.0)


def test_a_window_across_a_restart_or_without_batches_is_refused():
    zero = PhaseSnapshot(0, 0, 0, 0, 0, 5)
    with pytest.raises(WindowError, match="no batch"):
        stage_times(zero, zero, 1.0, stage_index=0, host="a", backend="numpy", layer_start=0, layer_end=1, rows=0)
    with pytest.raises(WindowError, match="backwards"):
        stage_times(PhaseSnapshot(0, 9, 0, 0, 0, 5), PhaseSnapshot(0, 1, 0, 0, 0, 9), 1.0, stage_index=0, host="a",
                    backend="numpy", layer_start=0, layer_end=1, rows=4)


def test_offsets_put_hosts_hours_ahead_of_and_behind_the_control_host():
    # Up for a day: the control host stays at 0, others go +3 h and -3 h.
    assert skewed_offsets(["alpha", "beta", "gamma"], "alpha", 10800, 86400) == {
        "alpha": 0, "beta": 10800, "gamma": -10800}
    # Up for minutes: no clock may go below zero, so the control host moves forward instead.
    offsets = skewed_offsets(["alpha", "beta"], "alpha", 10800, 300)
    assert offsets == {"alpha": 10800, "beta": 21600} and min(offsets.values()) >= 0
    assert describe(offsets, "alpha") == ("monotonic offsets relative to the control host alpha: beta +3 h; "
                                          "qualify's own clock -3 h")
    with pytest.raises(ValueError):
        skewed_offsets(["a"], "a", 0, 300)


def test_offsets_reach_the_hosts_of_a_fleet_spec():
    raw = {"version": 1, "control_host": "alpha", "hosts": [
        {"name": n, "backend": "numpy", "cpu_cores": 1, "memory_limit": "1GiB", "link": {"rate": "1Gbit/s"}}
        for n in ("alpha", "beta")]}
    spec = with_offsets(parse_fleet_spec(raw, "0" * 64), {"alpha": 10800, "beta": 21600})
    assert [h.clock_offset_s for h in spec.hosts] == [10800, 21600]


FACTS = ReportFacts("fleet.yaml (sha256 0123)", ("stage 0 on alpha: cpu, 1 cores", "stage 1 on beta: cpu, 0.5 cores"),
                    SNAPSHOT, "fornax qualify --fleet fleet.yaml --checkpoint ck --runs 2", "2026-01-01T00:00:00+00:00",
                    "beta +3 h", "0.5 0.4 0.3")


def test_the_report_is_self_contained_with_its_three_charts_and_the_failing_check():
    runs = [_all_pass(1), _all_pass(2, expiry_skewed_clocks="ended 3.100 s after submission, outside 2 s +- 0.5 s")]
    verdict = calibrate(runs, _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="h")
    page = render_report(verdict, runs, _predicted(0.004, 0.0105), FACTS)
    for chart in ("breakdown", "predicted-vs-measured", "parity"):
        assert re.search(rf'<svg class="chart" id="{chart}"', page)
    assert "FAILED" in page.split("</h1>")[0]
    failures = page.split('<ul id="failures">')[1].split("</ul>")[0]
    assert "run 2: expiry_skewed_clocks: ended 3.100 s" in failures
    assert "(prediction)" in page and "(physical)" in page
    assert page.count("<rect") >= 2 * len(PHASES)  # stacked segments for measured and predicted bars
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<script" not in page  # nothing fetched, no CDN


def test_a_passing_report_lists_no_failure():
    runs = [_all_pass(1)]
    verdict = calibrate(runs, _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="h")
    page = render_report(verdict, runs, _predicted(0.004, 0.0105), FACTS)
    assert "PASSED" in page.split("</h1>")[0] and '<ul id="failures"><li>none</li></ul>' in page


def test_records_follow_the_shared_schema_labels():
    runs = [_all_pass(1)]
    verdict = calibrate(runs, _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="h")
    on = MeasuredOn("alpha: cpu", "stage 0 alpha: numpy 2", SNAPSHOT, "fornax qualify", 10**18, 3600,
                    LayerRange(0, 4), DType.FP32, "prompts 2-8 tokens, 4 decode rows per microbatch")
    content, blob = calibration_record(verdict, on)
    assert (content.type, content.evidence_class) == (RecordType.CALIBRATION, EvidenceClass.PHYSICAL)
    assert dict(content.labels) == {"route_key": verdict.calibration.route_key, "passed": "true",
                                   "purpose": "gate"}
    assert content.subject == f"calibration:{verdict.calibration.route_key}"
    assert calibration_from_json(blob) == verdict.calibration
    assert content.provenance.layer_range == LayerRange(0, 4) and content.provenance.dtype is DType.FP32
    assert content.validity.valid_until_unix_ns - content.validity.valid_from_unix_ns == 3600 * 10**9
    measurement, _ = run_measurement(runs[0], verdict.calibration.route_key, on)
    assert measurement.type is RecordType.MEASUREMENT and dict(measurement.labels)["qualify_run"] == "1"
    assert "profile" not in dict(measurement.labels)  # not a stage or link profile
    qualification, _ = qualification_record({"verdict": {}}, verdict, on)
    assert qualification.type is RecordType.QUALIFICATION and dict(qualification.labels)["passed"] == "true"


def test_record_labels_are_in_the_registrys_order_so_signatures_survive_the_wire():
    verdict = calibrate([_all_pass(1)], _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="h")
    on = MeasuredOn("alpha: cpu", "numpy 2", SNAPSHOT, "fornax qualify", 1, 60, LayerRange(0, 4), DType.FP32, "s")
    for content, _ in (calibration_record(verdict, on), run_measurement(_all_pass(1), "k", on),
                       qualification_record({}, verdict, on)):
        assert list(content.labels) == sorted(content.labels)


def test_the_calibration_keeps_the_plans_evidence_and_must_name_its_route():
    predicted = _predicted(0.004, 0.0105)
    key = route_key(SNAPSHOT, [RouteStage("alpha", "numpy", 0, 3), RouteStage("beta", "numpy", 3, 4)])
    verdict = calibrate([_all_pass(1)], predicted, model_snapshot=SNAPSHOT, plan_hash="h",
                        evidence_ids=["measurement-a", "measurement-b"], plan_route_key=key)
    assert verdict.calibration.evidence_ids == ("measurement-a", "measurement-b")
    with pytest.raises(ValueError, match="route key"):
        calibrate([_all_pass(1)], predicted, model_snapshot=SNAPSHOT, plan_hash="h",
                  plan_route_key=key.replace("beta", "gamma"))


def test_the_calibration_keeps_every_term_predicted_and_measured_with_its_spread():
    runs = [_all_pass(1, 0.010), _all_pass(2, 0.011), _all_pass(3, 0.009)]
    c = calibrate(runs, _predicted(0.004, 0.0105), model_snapshot=SNAPSHOT, plan_hash="h").calibration
    beta = c.stages[1]
    assert beta.predicted_terms == {"compute": 0.0105, "pack": 0.0005, "wire": 0.001, "unpack": 0.0005}
    assert (beta.measured_terms["compute"].median, beta.measured_terms["compute"].low,
            beta.measured_terms["compute"].high, beta.measured_terms["compute"].runs) == (0.010, 0.009, 0.011, 3)
    assert calibration_from_json(to_json(c)).stages[1].measured_terms == beta.measured_terms


def test_a_failed_gate_names_the_term_that_missed_most_and_a_shared_cpu_as_likely_cause():
    from libs.profiles.schema import HostFacts

    hosts = (HostFacts("alpha", "AMD EPYC", 1.5, "0-1", 0), HostFacts("beta", "AMD EPYC", 0.5, "0", 0))
    runs = [RunOutcome(1, tuple(Check(n, True, "ok") for n in CHECKS), (_times(0, 0.0168), _times(1, 0.004, 0.0094)))]
    verdict = calibrate(runs, _predicted(0.008, 0.004), model_snapshot=SNAPSHOT, plan_hash="h", hosts=hosts)
    text = "\n".join(verdict.describe())
    assert not verdict.passed
    assert "missed most: stage 0 alpha compute: measured 16.8 ms (physical) against 8 ms predicted" in text
    assert "2.1x" in text and "likely cause: host alpha shares a CPU with beta" in text


def test_without_a_shared_cpu_a_compute_miss_is_put_down_to_what_shares_the_stages_cpu_in_the_route():
    from libs.profiles.schema import HostFacts

    hosts = (HostFacts("alpha", "AMD EPYC", 1.0, "0", 0), HostFacts("beta", "AMD EPYC", 0.5, "1", 0))
    runs = [RunOutcome(1, tuple(Check(n, True, "ok") for n in CHECKS), (_times(0, 0.0168), _times(1, 0.004)))]
    text = "\n".join(calibrate(runs, _predicted(0.008, 0.004), model_snapshot=SNAPSHOT, plan_hash="h",
                               hosts=hosts).describe())
    assert "likely cause: the profile times this stage's layers and its served step in the worker with its data " \
        "plane idle" in text
    assert "a failed gate feeds nothing back" in text  # it does not claim the next plan is corrected
    assert "shares a CPU with" not in text


def test_a_serving_window_expects_only_the_measured_decode_checks():
    from apps.qualify.gate import WINDOW_CHECKS, failure_lines

    window_run = RunOutcome(1, (Check("prefill", True, ""), Check("token_parity", True, "")), ())
    assert failure_lines([window_run], WINDOW_CHECKS) == ()
    assert "run 1: cancellation: not run" in failure_lines([window_run])  # a gate expects every check
    bad = RunOutcome(1, (Check("prefill", True, ""), Check("token_parity", False, "differs at token 3")), ())
    assert failure_lines([bad], WINDOW_CHECKS) == ("run 1: token_parity: differs at token 3",)
