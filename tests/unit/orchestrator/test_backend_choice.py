"""The measured switch decision: MAX replaces numpy only where every stage's median decode step
at every measured row count is no slower; otherwise the route stays on numpy and says why."""

from __future__ import annotations

import pytest

from libs.service.errors import FailedPrecondition, InvalidArgument
from services.orchestrator.route.backend_choice import (
    DEFAULT_ROWS,
    StageStepTimes,
    SwitchPolicy,
    decide,
    forced,
    parse_switch_policy,
)

# Medians recorded (physical) on the development box: the whole `tiny` model (4 layers) as one
# stage, seconds per served decode step from `backend_compare.time_steps` at 32 tokens of past
# (lscpu "AMD EPYC", 2 cores shared with other jobs, numpy 2.4.6, max 26.7.0). The other runs
# are spread around each median by hand. MAX is ~5.8x slower there: its per-launch floor.
TINY_NUMPY = {1: (0.001233, 0.001190, 0.001301, 0.001228, 0.001250),
              8: (0.002317, 0.002290, 0.002402, 0.002335, 0.002301)}
TINY_MAX = {1: (0.007124, 0.007010, 0.007230, 0.007151, 0.007099),
            8: (0.013192, 0.013050, 0.013301, 0.013210, 0.013180)}


def stage(index: int, numpy: dict, max_: dict, layers=(0, 4)) -> StageStepTimes:
    return StageStepTimes(index, layers[0], layers[1], "box-a", "AMD EPYC", 2.0, "0-1",
                          "StageWorkerService/CompareDecodeStep", 32, {"numpy": "numpy 2.4.6", "max": "max 26.7.0"},
                          {"numpy": numpy, "max": max_})


def scaled(figures: dict, factor: float) -> dict:
    return {rows: tuple(s * factor for s in runs) for rows, runs in figures.items()}


def test_tiny_stays_on_numpy_and_names_the_slowest_stage_and_rows():
    choice = decide("max", (stage(0, TINY_NUMPY, TINY_MAX),), DEFAULT_ROWS)
    assert choice.backend == "numpy" and not choice.switch and choice.policy is SwitchPolicy.MEASURED
    # the worst ratio is at 1 row: 7.124 / 1.233 = 5.78
    assert choice.reason.startswith("stayed on numpy: max measured 5.78x slower at stage 0 at 1 row")
    assert "max 7.124 ms vs numpy 1.233 ms per step on box-a (AMD EPYC)" in choice.reason


def test_switches_when_max_is_no_slower_everywhere():
    faster = scaled(TINY_NUMPY, 0.5)
    choice = decide("max", (stage(0, TINY_NUMPY, faster, (0, 2)), stage(1, TINY_NUMPY, TINY_NUMPY, (2, 4))),
                    DEFAULT_ROWS)
    assert choice.backend == "max" and choice.switch
    assert "the closest: stage 1" in choice.reason  # equal medians switch: the rule is <=


def test_one_slower_stage_or_row_count_keeps_numpy():
    mixed = {1: scaled(TINY_NUMPY, 1.05)[1], 8: scaled(TINY_NUMPY, 0.5)[8]}  # wins at 8, loses at 1
    choice = decide("max", (stage(0, TINY_NUMPY, scaled(TINY_NUMPY, 0.5), (0, 2)), stage(1, TINY_NUMPY, mixed, (2, 4))),
                    DEFAULT_ROWS)
    assert choice.backend == "numpy"
    assert "1.05x slower at stage 1 at 1 row" in choice.reason


def test_the_median_decides_not_one_outlier_run():
    outlier = {rows: (runs[0] * 40,) + tuple(s * 0.9 for s in runs[1:]) for rows, runs in TINY_NUMPY.items()}
    assert decide("max", (stage(0, TINY_NUMPY, outlier),), DEFAULT_ROWS).switch


def test_a_missing_figure_is_refused_not_guessed():
    with pytest.raises(FailedPrecondition) as err:
        decide("max", (stage(0, TINY_NUMPY, {1: TINY_MAX[1]}),), DEFAULT_ROWS)
    assert err.value.reason == "INCOMPLETE_STEP_TIMES" and "no max figure at 8 rows" in err.value.message
    with pytest.raises(FailedPrecondition) as err:
        decide("max", (), DEFAULT_ROWS)
    assert err.value.reason == "INCOMPLETE_STEP_TIMES"


def test_snapshot_carries_both_figures_labelled_physical():
    snap = decide("max", (stage(0, TINY_NUMPY, TINY_MAX),), DEFAULT_ROWS).snapshot()
    assert snap["backend"] == "numpy" and snap["candidate"] == "max" and snap["policy"] == "measured"
    assert snap["rows"] == [1, 8] and "on every stage at every measured row count" in snap["rule"]
    (only,) = snap["stages"]
    assert only["evidence_class"] == "physical" and only["layers"] == [0, 4]
    assert only["measured_on"]["cpu_model"] == "AMD EPYC" and only["measured_on"]["builds"]["max"] == "max 26.7.0"
    assert only["figures"][0] == {"rows": 1, "numpy_ms_per_step": 1.233, "max_ms_per_step": 7.124,
                                  "max_speed_vs_numpy": round(1.233 / 7.124, 4), "runs": {"numpy": 5, "max": 5}}


def test_forced_switch_says_it_was_not_measured():
    choice = forced("max")
    assert choice.switch and choice.policy is SwitchPolicy.ALWAYS and "without measuring" in choice.reason
    assert choice.snapshot()["rule"] == "forced" and choice.snapshot()["stages"] == []


@pytest.mark.parametrize("value", ["", "Measured", "sometimes", "max"])
def test_bad_policy_fails_closed(value):
    with pytest.raises(InvalidArgument) as err:
        parse_switch_policy(value, "FORNAX_MAX_SWITCH")
    assert err.value.reason == "INVALID_MAX_SWITCH" and err.value.field == "FORNAX_MAX_SWITCH"
    assert parse_switch_policy("always") is SwitchPolicy.ALWAYS
