"""Route calibrations fed back into the cost model. Pure.

A calibration record (physical, signed) holds, per stage of a route, what the plan predicted for
compute, pack, wire and unpack and what the route measured (median, low, high over its runs).
Two kinds feed back:
- `fornax qualify`'s passing gates;
- the serving window `fornax profile` ends with (`SERVING_WINDOW`): a short decode served on
  the plan its fresh profiles give. A layer profile times each layer kind alone on a host whose
  data plane is idle; a route runs each microbatch through the data plane (FNX2 frames, TLS,
  leases, spans) and the control services on the same cores, and on a one-core host every graph
  launch of a stage waits behind them. So the route is the better witness of what the host does
  while serving, and a window lets the first plan after a profile start from it.
A failed gate feeds nothing back: its report names the term that missed and why.

Each kind of a host's decode compute predicted from its stage profile (embed, dense, moe, head
and the per-microbatch step) is scaled by `measured compute / predicted compute` of the newest
usable calibration of this model that predicted from that same profile record (it names it in
its evidence ids) and whose stage on the host ran that kind: a window that measured a host's
dense layer says nothing of its MoE layers (measured on this project's half-core numpy host: a
dense layer and the embeddings served at 0.85x their profile while its MoE layers served at about
1.9x, so one factor for the host mispriced every split that moved MoE layers onto it). A link's
one-way frame time is scaled by `measured wire / predicted wire` likewise, when the link record
is the one the calibration rested on. A newer
profile than the calibration stands on its own until measured again. A calibration whose own
prediction was already scaled by an earlier one (it names that record too) carries that factor
on (that of the same kind), so qualifying a plan that rested on a window keeps the window's level.
The factor is applied across rows, past and every layer of its kind (the profile keeps the shape,
the route the level; measured on this project's one-core MAX hosts the route's excess grew with
the stage's layers, 1.5x at two layers and 1.9x at three), and a scaled term names the
calibration record and the factor (`Correction.describe`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from libs.profiles import schema
from services.planner.profiles import CalibrationRecord, ProfileBook

COMPUTE, WIRE = "compute", "wire"
StageFilter = Callable[[schema.StageCalibration], bool]  # whether a calibrated stage ran a given kind


@dataclass(frozen=True)
class Correction:
    """One term's route calibration: measured (physical) over predicted (prediction)."""

    record_id: str  # the calibration record
    term: str
    measured: schema.Figure
    predicted_s: float
    rows: float
    past_tokens: float

    purpose: str = schema.GATE
    prior: float = 1.0  # the factor the calibration's own prediction already carried (1: none)
    # Empty: the calibrated stage ran the kind it scales. Else the kinds it ran, when it stands in
    # for a kind no calibration of the host ran (`borrowed`).
    ran_instead: tuple[str, ...] = ()

    @property
    def factor(self) -> float:
        return self.measured.median / self.predicted_s * self.prior

    def describe(self) -> str:
        at = (f" at {self.rows:.3g} rows" if self.rows else "") + (
            f", {self.past_tokens:.3g} tokens of past" if self.past_tokens else "")
        what = "serving window" if self.purpose == schema.SERVING_WINDOW else "route calibration"
        carried = f" times the {self.prior:.3g} its prediction carried" if self.prior != 1.0 else ""
        borrowed = (f", a stage of {', '.join(self.ran_instead)} only (the route's overhead it measured "
                    "stands for a kind no route ran here)") if self.ran_instead else ""
        return (f"{what} {self.record_id}: {self.term} measured {self.measured.describe()} (physical) "
                f"against {self.predicted_s:.6g} s predicted{at}{carried}{borrowed}; factor {self.factor:.3g} applied")


def borrowed(correction: Correction | None, ran: tuple[str, ...]) -> Correction | None:
    """A host's calibration of other kinds (`ran`), standing in for a kind no route ran on the
    host, where it raises it: a route adds its data plane, control services and neighbours to every
    kind a host runs, so its excess over the profile carries over; a kind that ran faster than its
    profile says that kind's profile read high, not another's, so a factor below 1 is not borrowed."""
    if correction is None or correction.factor <= 1.0:
        return None
    return replace(correction, ran_instead=ran)


def _usable(stage: schema.StageCalibration, term: str) -> bool:
    return term in stage.measured_terms and stage.predicted_terms.get(term, 0.0) > 0 and \
        stage.measured_terms[term].median > 0


def _feeds_back(calibration: schema.Calibration) -> bool:
    return calibration.passed or (calibration.purpose == schema.SERVING_WINDOW and not calibration.failures)


def _newest_first(book: ProfileBook, model_snapshot: str, before_ns: int | None = None) -> list[CalibrationRecord]:
    found = [r for r in book.calibrations if r.standing.ok and _feeds_back(r.calibration)
             and r.calibration.route_key.startswith(model_snapshot + "|")
             and (before_ns is None or r.calibration.measured_unix_ns < before_ns)]
    return sorted(found, key=lambda r: r.calibration.measured_unix_ns, reverse=True)


def compute_correction(book: ProfileBook, model_snapshot: str, host: str, stage_record_id: str,
                       ran: StageFilter = lambda stage: True, before_ns: int | None = None) -> Correction | None:
    """The newest calibration (measured before `before_ns`) of a stage on `host` that predicted
    from `stage_record_id` and `ran` the kind in question, carrying the factor its own
    prediction rested on."""
    for record in _newest_first(book, model_snapshot, before_ns):
        if stage_record_id not in record.calibration.evidence_ids:
            continue
        for stage in record.calibration.stages:
            if stage.host == host and _usable(stage, COMPUTE) and ran(stage):
                prior = compute_correction(book, model_snapshot, host, stage_record_id, ran,
                                           record.calibration.measured_unix_ns)
                return Correction(record.record_id, COMPUTE, stage.measured_terms[COMPUTE],
                                  stage.predicted_terms[COMPUTE], stage.rows, stage.past_tokens,
                                  record.calibration.purpose, _carried(prior, record))
    return None


def wire_correction(book: ProfileBook, model_snapshot: str, from_host: str, to_host: str,
                    link_record_id: str, before_ns: int | None = None) -> Correction | None:
    """The newest calibration (measured before `before_ns`) whose stage on `from_host` sent to
    `to_host` over `link_record_id`, carrying the factor its own prediction rested on."""
    for record in _newest_first(book, model_snapshot, before_ns):
        if link_record_id not in record.calibration.evidence_ids:
            continue
        stages = sorted(record.calibration.stages, key=lambda s: s.stage_index)
        for here, there in zip(stages, stages[1:], strict=False):
            if (here.host, there.host) == (from_host, to_host) and _usable(here, WIRE):
                prior = wire_correction(book, model_snapshot, from_host, to_host, link_record_id,
                                        record.calibration.measured_unix_ns)
                return Correction(record.record_id, WIRE, here.measured_terms[WIRE], here.predicted_terms[WIRE],
                                  here.rows, here.past_tokens, record.calibration.purpose, _carried(prior, record))
    return None


def _carried(prior: Correction | None, record: CalibrationRecord) -> float:
    """The earlier correction's factor, when `record`'s prediction rested on it (names its record)."""
    return prior.factor if prior is not None and prior.record_id in record.calibration.evidence_ids else 1.0
