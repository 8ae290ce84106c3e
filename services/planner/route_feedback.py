"""Route calibrations fed back into the cost model. Pure.

`fornax qualify` measures the installed route term by term and stores a calibration record
(physical, signed): per stage, what the plan predicted for compute, pack, wire and unpack and
what the route measured (median, low, high over the runs). A layer profile times each layer
kind alone on an idle host; the route runs every stage at once, with the control services,
the data plane and the other hosts busy. Where the two disagree, the route is the better
witness of what the host does while serving.

So a host's decode compute predicted from its stage profile is scaled by
`measured compute / predicted compute` of the newest passing calibration of this model that predicted
from that same profile record (it names it in its evidence ids); a link's one-way frame time by
`measured wire / predicted wire` likewise, when the link record is the one the calibration
rested on. A newer profile than the calibration qualified stands on its own until qualified.
A failed gate feeds nothing back: its report names the term that missed and why, and re-planning
on its figures would move the route to a placement no gate has measured. The factor is applied
across rows and past (the profile keeps the shape, the route the level),
and a scaled term names the calibration record and the factor (`Correction.describe`).
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.profiles import schema
from services.planner.profiles import CalibrationRecord, ProfileBook

COMPUTE, WIRE = "compute", "wire"


@dataclass(frozen=True)
class Correction:
    """One term's route calibration: measured (physical) over predicted (prediction)."""

    record_id: str  # the calibration record
    term: str
    measured: schema.Figure
    predicted_s: float
    rows: float
    past_tokens: float

    @property
    def factor(self) -> float:
        return self.measured.median / self.predicted_s

    def describe(self) -> str:
        at = (f" at {self.rows:.3g} rows" if self.rows else "") + (
            f", {self.past_tokens:.3g} tokens of past" if self.past_tokens else "")
        return (f"route calibration {self.record_id}: {self.term} measured {self.measured.describe()} (physical) "
                f"against {self.predicted_s:.6g} s predicted{at}; factor {self.factor:.3g} applied")


def _usable(stage: schema.StageCalibration, term: str) -> bool:
    return term in stage.measured_terms and stage.predicted_terms.get(term, 0.0) > 0 and \
        stage.measured_terms[term].median > 0


def _newest_first(book: ProfileBook, model_snapshot: str) -> list[CalibrationRecord]:
    found = [r for r in book.calibrations if r.standing.ok and r.calibration.passed
             and r.calibration.route_key.startswith(model_snapshot + "|")]
    return sorted(found, key=lambda r: r.calibration.measured_unix_ns, reverse=True)


def compute_correction(book: ProfileBook, model_snapshot: str, host: str, stage_record_id: str) -> Correction | None:
    """The newest calibration of a stage on `host` that predicted from `stage_record_id`."""
    for record in _newest_first(book, model_snapshot):
        if stage_record_id not in record.calibration.evidence_ids:
            continue
        for stage in record.calibration.stages:
            if stage.host == host and _usable(stage, COMPUTE):
                return Correction(record.record_id, COMPUTE, stage.measured_terms[COMPUTE],
                                  stage.predicted_terms[COMPUTE], stage.rows, stage.past_tokens)
    return None


def wire_correction(book: ProfileBook, model_snapshot: str, from_host: str, to_host: str,
                    link_record_id: str) -> Correction | None:
    """The newest calibration whose stage on `from_host` sent to `to_host` over `link_record_id`."""
    for record in _newest_first(book, model_snapshot):
        if link_record_id not in record.calibration.evidence_ids:
            continue
        stages = sorted(record.calibration.stages, key=lambda s: s.stage_index)
        for here, there in zip(stages, stages[1:], strict=False):
            if (here.host, there.host) == (from_host, to_host) and _usable(here, WIRE):
                return Correction(record.record_id, WIRE, here.measured_terms[WIRE], here.predicted_terms[WIRE],
                                  here.rows, here.past_tokens)
    return None
