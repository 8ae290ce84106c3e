"""The qualification gate's verdict, as pure values: checks per run, per-stage phase times,
parity per boundary, and the calibration of the installed plan's predictions against them.

Nothing here measures or talks to a fleet; `apps.qualify.fleet_run` does, and hands in what it
saw. Every time is physical (this fleet's hosts), except `PredictedStage`, which is the plan's
cost model and is always printed as a prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from apps.qualify.diagnosis import miss_lines
from libs.profiles.schema import Calibration, Figure, HostFacts, RouteStage, StageCalibration, route_key

DEFAULT_TOLERANCE = 0.25
# Per-stage time of one decode microbatch, split by phase. `wire` is the next-hop round trip
# minus the next hop's own queue and execute time; `exposed_wait` is the part of the stage's
# step interval its own phases do not explain (idle, waiting for its input).
PHASES = ("compute", "pack", "wire", "unpack", "queue", "exposed_wait")
# The planner's bottleneck terms: stage service plus pack, wire and unpack.
SERVICE_PHASES = ("compute", "pack", "wire", "unpack")
# What a serving window (`fornax profile`) runs: the measured decode only.
WINDOW_CHECKS = ("prefill", "token_parity")
CHECKS = ("prefill", "changing_subset_decode", "cancellation", "expiry_skewed_clocks", "reconnect_fencing",
          "cleanup", "token_parity", "boundary_parity", "final_logit_parity")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class StageTimes:
    """Seconds per decode microbatch on one stage over a measured window (physical)."""

    stage_index: int
    host: str
    backend: str
    layer_start: int
    layer_end: int
    batches: int
    rows_per_batch: float
    seconds: dict[str, float]  # one per PHASES entry
    past_per_row: float = 0.0  # mean tokens of past (KV) per decode row in the window; 0: not measured

    @property
    def service_s(self) -> float:
        return sum(self.seconds[p] for p in SERVICE_PHASES)


@dataclass(frozen=True)
class PredictedStage:
    """The installed plan's cost-model terms for one stage's decode microbatch: a prediction."""

    stage_index: int
    host: str
    backend: str
    layer_start: int
    layer_end: int
    seconds: dict[str, float]  # one per PHASES entry
    rows: float = 0.0  # rows per microbatch these terms were predicted at (0: the plan's target rows)
    past: float = 0.0  # tokens of past per row they were predicted at (0: the plan's decode context)

    @property
    def service_s(self) -> float:
        return sum(self.seconds[p] for p in SERVICE_PHASES)


@dataclass(frozen=True)
class BoundaryParity:
    label: str
    max_abs_diff: float  # the figure `measure` names (max |diff| unless stated)
    tolerance: float
    measure: str = "max |diff|"
    # False: stated, not gated (a MAX stage's block formats quantize activations, so its
    # boundaries are not float32-exact; its final logits are gated on top-1 instead).
    gated: bool = True

    @property
    def passed(self) -> bool:
        return not self.gated or self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class RunOutcome:
    run: int  # 1-based
    checks: tuple[Check, ...]
    stages: tuple[StageTimes, ...]
    boundaries: tuple[BoundaryParity, ...] = ()

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def bottleneck_s(self) -> float:
        return max((s.service_s for s in self.stages), default=0.0)


@dataclass(frozen=True)
class Verdict:
    calibration: Calibration
    failures: tuple[str, ...]
    hosts: tuple[HostFacts, ...] = ()  # the stage hosts as their cgroups enforced them

    @property
    def passed(self) -> bool:
        return self.calibration.passed

    def describe(self) -> list[str]:
        c = self.calibration
        lines = [f"calibration: bottleneck prediction error {c.bottleneck_prediction_error:.1%} "
                 f"(tolerance {c.tolerance:.0%}); predicted bottleneck {c.predicted_bottleneck_s * 1e3:.4g} ms "
                 f"per decode microbatch (prediction), measured {_ms(c.measured_bottleneck_s)} (physical)"]
        basis = (f"predictions evaluated at each stage's {c.rows_basis} per microbatch" if c.rows_basis
                 else "predictions at the plan's target rows per microbatch")
        lines.append(f"  {basis}")
        for s in c.stages:
            at = (f" at {s.rows:.3g} rows" if s.rows else "") + (f", {s.past_tokens:.3g} tokens of past per row"
                                                                 if s.past_tokens else "")
            lines.append(f"  stage {s.stage_index} {s.host} [{s.layer_start},{s.layer_end}): predicted "
                         f"{s.predicted_s * 1e3:.4g} ms{at} (prediction), measured {_ms(s.measured_s)} (physical), "
                         f"error {s.relative_error:.1%}")
        lines += [f"FAILED {f}" for f in self.failures]
        if not self.passed:
            lines += miss_lines(c, self.hosts)
        return lines


def _ms(figure: Figure) -> str:
    return (f"{figure.median * 1e3:.4g} ms (runs {figure.runs}, low {figure.low * 1e3:.4g}, "
            f"high {figure.high * 1e3:.4g}, spread {figure.spread:.1%})")


def failure_lines(runs: Sequence[RunOutcome], expected: Sequence[str] = CHECKS) -> tuple[str, ...]:
    """"run N: check: detail" for every failed check, in run order, plus checks a run never reported."""
    lines: list[str] = []
    for outcome in runs:
        reported = {c.name for c in outcome.checks}
        lines += [f"run {outcome.run}: {c.name}: {c.detail}" for c in outcome.failed]
        lines += [f"run {outcome.run}: {name}: not run" for name in expected if name not in reported]
    return tuple(lines)


def route_stages(predicted: Sequence[PredictedStage]) -> tuple[RouteStage, ...]:
    return tuple(RouteStage(p.host, p.backend, p.layer_start, p.layer_end) for p in predicted)


def calibrate(runs: Sequence[RunOutcome], predicted: Sequence[PredictedStage], *, model_snapshot: str,
              plan_hash: str, evidence_ids: Sequence[str] = (), tolerance: float = DEFAULT_TOLERANCE,
              command: str = "", measured_unix_ns: int = 0, valid_for_s: int = 0,
              plan_route_key: str = "", rows_basis: str = "", hosts: Sequence[HostFacts] = (),
              expected_checks: Sequence[str] = CHECKS) -> Verdict:
    """Term-by-term comparison of the plan's per-stage predictions with every run's measurement.

    The gate passes only when every run passed every check and the bottleneck prediction error
    (|measured - predicted| / measured, on the median over runs) is within `tolerance`. A plan
    that states its route key (one planned from profiles) must name the same placement."""
    if not runs:
        raise ValueError("qualification needs at least one run")
    if not predicted:
        raise ValueError("the installed plan has no stages to calibrate")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    key = route_key(model_snapshot, route_stages(predicted))
    if plan_route_key and plan_route_key != key:
        raise ValueError(f"the plan's route key {plan_route_key!r} is not the placement measured ({key!r})")
    want = sorted(p.stage_index for p in predicted)
    measured = [r for r in runs if sorted(s.stage_index for s in r.stages) == want]
    failures = failure_lines(runs, expected_checks) + tuple(
        f"run {r.run}: measurement: phase times of stages {sorted(s.stage_index for s in r.stages)}, "
        f"the plan has {want}" for r in runs if r not in measured)
    stages = []
    for p in sorted(predicted, key=lambda p: p.stage_index):
        # No run measured: a zero figure, whose prediction error is infinite (the gate fails anyway).
        times = [next(s for s in r.stages if s.stage_index == p.stage_index) for r in measured]
        samples = [t.service_s for t in times] or [0.0]
        terms = {k: Figure.of([t.seconds[k] for t in times], "s") for k in SERVICE_PHASES} if times else {}
        stages.append(StageCalibration(p.stage_index, p.host, p.layer_start, p.layer_end, p.service_s,
                                       Figure.of(samples, "s"), p.rows, p.past,
                                       {k: p.seconds[k] for k in SERVICE_PHASES}, terms))
    calibration = Calibration(
        route_key=key, plan_hash=plan_hash,
        evidence_ids=tuple(evidence_ids), stages=tuple(stages),
        predicted_bottleneck_s=max(p.service_s for p in predicted),
        measured_bottleneck_s=Figure.of([r.bottleneck_s for r in measured] or [0.0], "s"), tolerance=tolerance,
        runs=len(runs), failures=failures, command=command, measured_unix_ns=measured_unix_ns,
        valid_for_s=valid_for_s, rows_basis=rows_basis)
    return Verdict(calibration, failures, tuple(hosts))


def phase_medians(stage_runs: Sequence[StageTimes]) -> dict[str, float]:
    """Median per phase over runs, for the report's stacked bars."""
    return {p: statistics.median(s.seconds[p] for s in stage_runs) for p in PHASES}
