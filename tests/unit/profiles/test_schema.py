"""Profiles and calibrations round-trip through their canonical JSON and refuse other shapes."""

from __future__ import annotations

import json

import pytest

from libs.profiles.schema import (
    Calibration,
    Figure,
    HostFacts,
    LayerKindProfile,
    LinkProfile,
    ProfileFormatError,
    RouteStage,
    StageCalibration,
    StageProfile,
    calibration_from_json,
    link_profile_from_json,
    route_key,
    stage_profile_from_json,
    to_json,
)


def _stage() -> StageProfile:
    dense = LayerKindProfile("dense", {16: Figure.of([1e-4, 2e-4, 1.5e-4], "s/token")},
                             {1: Figure.of([3e-3], "s/microbatch")}, 1024, 64)
    return StageProfile(HostFacts("beta", "AMD EPYC", 0.5, "1", 3 << 30), "spiffe://fornax/stage/stage_worker_1",
                        "numpy", "numpy 2.4", "cpu", "sha256:ab", "fp32", 2048, 32, (dense,), "fornax profile",
                        1_700_000_000_000_000_000, 86400)


def test_figure_keeps_median_spread_and_runs():
    f = Figure.of([1.0, 3.0, 2.0], "s")
    assert (f.median, f.low, f.high, f.runs) == (2.0, 1.0, 3.0, 3)
    assert f.spread == pytest.approx(1.0)
    assert "runs 3" in f.describe() and "spread 100.0%" in f.describe()
    with pytest.raises(ProfileFormatError):
        Figure.of([], "s")


def test_stage_profile_round_trips_canonically():
    profile = _stage()
    blob = to_json(profile)
    assert stage_profile_from_json(blob) == profile
    assert to_json(stage_profile_from_json(blob)) == blob
    assert profile.kind("dense") is not None and profile.kind("moe") is None


def test_link_profile_time_is_half_rtt_plus_serialisation():
    link = LinkProfile("alpha", "beta", Figure.of([2e-3], "s"), Figure.of([1e8], "B/s"), "fnx2+tls", "c", 1, 60)
    assert link_profile_from_json(to_json(link)) == link
    assert link.seconds_for(10**6) == pytest.approx(1e-3 + 1e-2)


def test_calibration_passes_only_within_tolerance_and_without_failures():
    stage = StageCalibration(0, "alpha", 0, 4, 0.010, Figure.of([0.011, 0.012], "s"))
    good = Calibration("k", "sha256:p", ("r1",), (stage,), 0.010, Figure.of([0.0115], "s"), 0.25, 3)
    assert calibration_from_json(to_json(good)) == good
    assert good.passed and good.bottleneck_prediction_error == pytest.approx(0.0015 / 0.0115)
    far = Calibration("k", "sha256:p", (), (stage,), 0.001, Figure.of([0.0115], "s"), 0.25, 3)
    assert not far.passed
    failed = Calibration("k", "sha256:p", (), (stage,), 0.010, Figure.of([0.0115], "s"), 0.25, 3,
                         failures=("run 2: cancellation: KV left on stage 1",))
    assert not failed.passed


def test_wrong_schema_and_bad_fields_are_refused():
    with pytest.raises(ProfileFormatError, match="expected schema"):
        link_profile_from_json(to_json(_stage()))
    data = json.loads(to_json(_stage()))
    data["kinds"][0]["prefill_s_per_token"]["16"]["median"] = "fast"
    with pytest.raises(ProfileFormatError):
        stage_profile_from_json(json.dumps(data).encode())
    with pytest.raises(ProfileFormatError, match="not JSON"):
        stage_profile_from_json(b"\xff")


def test_route_key_names_hosts_backends_and_ranges_in_order():
    key = route_key("sha256:m", [RouteStage("alpha", "max", 0, 3), RouteStage("beta", "numpy", 3, 4)])
    assert key == "sha256:m|alpha:max[0:3]>beta:numpy[3:4]"
