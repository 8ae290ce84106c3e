"""Drift: does each stage's measured decode service time stay within the plan's prediction?

Pure: `DriftTracker.observe` takes one round of stage reports (the rolling mean of each stage's
most recent decode microbatches, measured on its own host) and returns the route's calibration.
A stage is judged only on rounds that bring new microbatches, so an idle route never piles up
evidence from one old window. It turns "uncalibrated" after `sustain_rounds` such rounds in a
row outside the relative bound, and back to "calibrated" only after `recover_rounds` rounds in a
row well inside it (within `recover_fraction` of the bound): a transient excursion changes
nothing, and a value hovering at the bound does not flap. A stage whose plan has no prediction
is "no prediction", and one not yet measured enough is "unmeasured": never "calibrated" by default.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class Calibration(enum.Enum):
    NO_PREDICTION = "no prediction"
    UNMEASURED = "unmeasured"
    CALIBRATED = "calibrated"
    UNCALIBRATED = "uncalibrated"


@dataclass(frozen=True)
class DriftPolicy:
    relative_bound: float = 0.5  # |measured - predicted| / predicted above this is outside
    sustain_rounds: int = 3
    recover_rounds: int = 3
    recover_fraction: float = 0.8  # recovery needs the error within this fraction of the bound
    min_microbatches: int = 8  # a rolling mean over fewer microbatches is not judged

    def __post_init__(self) -> None:
        if not (self.relative_bound > 0 and self.sustain_rounds >= 1 and self.recover_rounds >= 1
                and 0 < self.recover_fraction <= 1 and self.min_microbatches >= 1):
            raise ValueError(f"invalid drift policy {self}")


@dataclass(frozen=True)
class MeasuredService:
    """One stage's report: physical figures on its own clock."""

    decode_microbatches_total: int  # cumulative: tells a fresh report from a repeated one
    recent_decode_service_s: float  # rolling mean per decode microbatch
    recent_microbatches: int
    recent_rows: float  # mean sequences per microbatch in that window


@dataclass(frozen=True)
class StageCalibration:
    index: int
    state: Calibration
    predicted_s: float | None
    measured: MeasuredService | None

    @property
    def relative_error(self) -> float | None:
        if self.predicted_s is None or self.measured is None or self.measured.recent_microbatches == 0:
            return None
        return abs(self.measured.recent_decode_service_s - self.predicted_s) / self.predicted_s

    def describe(self) -> str:
        measured = self.measured
        predicted = "no prediction" if self.predicted_s is None else f"plan predicted {self.predicted_s:.4g} s"
        if measured is None or measured.recent_microbatches == 0:
            return f"stage {self.index}: {predicted}, not measured yet"
        return (f"stage {self.index}: {predicted}, measured {measured.recent_decode_service_s:.4g} s over "
                f"{measured.recent_microbatches} microbatches of {measured.recent_rows:.3g} rows")


@dataclass(frozen=True)
class RouteCalibration:
    state: Calibration
    reason: str
    prediction_basis: str
    relative_bound: float
    stages: tuple[StageCalibration, ...]


def usable_prediction(value: float | None) -> float | None:
    """A prediction to compare with, or None: zero, negative or non-finite is no prediction."""
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    return value


@dataclass
class _StageTrack:
    predicted_s: float | None
    state: Calibration
    outside: int = 0
    inside: int = 0
    seen_total: int = -1
    last: MeasuredService | None = None


@dataclass
class DriftTracker:
    predictions: Sequence[float | None]
    prediction_basis: str
    policy: DriftPolicy = DriftPolicy()
    _tracks: list[_StageTrack] = field(init=False)

    def __post_init__(self) -> None:
        self._tracks = []
        for value in self.predictions:
            predicted = usable_prediction(value)
            state = Calibration.NO_PREDICTION if predicted is None else Calibration.UNMEASURED
            self._tracks.append(_StageTrack(predicted, state))

    def observe(self, reports: Sequence[MeasuredService | None]) -> RouteCalibration:
        """One probe round: per stage its report, or None when it could not be read."""
        for track, report in zip(self._tracks, reports, strict=True):
            self._observe_stage(track, report)
        return self.calibration

    def _observe_stage(self, track: _StageTrack, report: MeasuredService | None) -> None:
        if report is None or report.decode_microbatches_total == track.seen_total:
            return  # nothing new since the last round (a lower count: the stage was reloaded)
        track.seen_total = report.decode_microbatches_total
        track.last = report
        if track.predicted_s is None or report.recent_microbatches < self.policy.min_microbatches:
            return
        error = abs(report.recent_decode_service_s - track.predicted_s) / track.predicted_s
        bound = self.policy.relative_bound
        track.outside = track.outside + 1 if error > bound else 0
        track.inside = track.inside + 1 if error <= bound * self.policy.recover_fraction else 0
        if track.state is not Calibration.UNCALIBRATED and track.outside >= self.policy.sustain_rounds:
            track.state = Calibration.UNCALIBRATED
        elif track.state is not Calibration.CALIBRATED and track.inside >= self.policy.recover_rounds:
            track.state = Calibration.CALIBRATED

    @property
    def calibration(self) -> RouteCalibration:
        stages = tuple(StageCalibration(i, t.state, t.predicted_s, t.last) for i, t in enumerate(self._tracks))
        state = route_state(tuple(s.state for s in stages))
        return RouteCalibration(state, _reason(state, stages, self.prediction_basis), self.prediction_basis,
                                self.policy.relative_bound, stages)


def route_state(states: tuple[Calibration, ...]) -> Calibration:
    """The route is calibrated only when every stage is; the worst stage names its state."""
    if not states:
        return Calibration.NO_PREDICTION
    for worst in (Calibration.UNCALIBRATED, Calibration.NO_PREDICTION, Calibration.UNMEASURED):
        if worst in states:
            return worst
    return Calibration.CALIBRATED


def prediction_basis(plan_mode: str, from_profiles: bool = False, declared_terms: int = 0) -> str:
    """Where a plan's time predictions come from, in words that travel with every verdict."""
    if from_profiles and declared_terms == 0:
        return (f"evidence-backed {plan_mode} plan: predictions computed from physical profile records "
                "(still predictions)")
    if from_profiles:
        return (f"exploratory plan: predictions from physical profile records, {declared_terms} term(s) "
                "from declared figures")
    return "exploratory plan: predictions from declared figures (cost model), not from measured profiles"


def _reason(state: Calibration, stages: tuple[StageCalibration, ...], basis: str) -> str:
    named = [s for s in stages if s.state is state] or list(stages)
    return f"{state.value} ({'; '.join(s.describe() for s in named)}); {basis}"
