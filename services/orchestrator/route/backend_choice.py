"""Whether a live switch from the numpy reference route to MAX is an upgrade: a pure decision
on decode-step times each stage measured on its own host (`CompareDecodeStep`).

The rule (policy `measured`, the default): for every stage and every measured row count, the
median of the candidate backend's runs must be at most the median of numpy's runs. Then the
route switches; otherwise it stays on numpy and says which stage, at which row count, was
slower, by how much. Policy `always` switches without measuring and says so. A measurement
that is missing a figure is refused (INCOMPLETE_STEP_TIMES): the caller keeps the reference
route serving and reports why, never a silent choice.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from libs.service.errors import FailedPrecondition, InvalidArgument

REFERENCE = "numpy"
# The route's load the switch is measured at: one stream, and the concurrency `fornax bench
# serve` reports beside it.
DEFAULT_ROWS = (1, 8)
MAX_ROWS = 1024  # as CompareDecodeStep accepts
MAX_ROW_COUNTS = 8
FIGURE = "physical: median seconds per served decode step over the runs, on the stage's own host"


class SwitchPolicy(Enum):
    MEASURED = "measured"  # switch only where MAX's measured step beats numpy's
    ALWAYS = "always"  # switch unconditionally (the operator's explicit choice)


def parse_switch_policy(value: str, field: str = "max_switch") -> SwitchPolicy:
    try:
        return SwitchPolicy(value)
    except ValueError:
        raise InvalidArgument(f"{field} must be one of {[p.value for p in SwitchPolicy]}, got {value!r}",
                              reason="INVALID_MAX_SWITCH", field=field) from None


def parse_rows(value: str, field: str = "max_switch_rows") -> tuple[int, ...]:
    """Comma-separated decode row counts, e.g. "1,8": at most 8, each in [1, 1024]."""
    try:
        rows = tuple(sorted({int(part) for part in value.split(",") if part.strip()}))
    except ValueError:
        rows = ()
    if not rows or rows[0] < 1 or rows[-1] > MAX_ROWS or len(rows) > MAX_ROW_COUNTS:
        raise InvalidArgument(f"{field} must be 1 to {MAX_ROW_COUNTS} comma-separated row counts in "
                              f"[1, {MAX_ROWS}], got {value!r}", reason="INVALID_MAX_SWITCH_ROWS", field=field)
    return rows


@dataclass(frozen=True)
class StageStepTimes:
    """One stage's measured decode steps, as its worker answered CompareDecodeStep."""

    stage: int
    layer_start: int
    layer_end: int
    host: str
    cpu_model: str
    cpu_quota_cores: float
    cpuset: str
    command: str
    context_tokens: int
    builds: Mapping[str, str]  # backend -> build, e.g. "max 26.7.0"
    samples: Mapping[str, Mapping[int, tuple[float, ...]]]  # backend -> rows -> seconds per step, per run

    def median(self, backend: str, rows: int) -> float:
        runs = self.samples.get(backend, {}).get(rows, ())
        if not runs:
            raise FailedPrecondition(f"stage {self.stage} has no {backend} figure at {rows} rows",
                                     reason="INCOMPLETE_STEP_TIMES")
        return statistics.median(runs)

    def snapshot(self, candidate: str, rows: tuple[int, ...]) -> dict[str, object]:
        figures = []
        for r in rows:
            ref, cand = self.median(REFERENCE, r), self.median(candidate, r)
            figures.append({"rows": r, f"{REFERENCE}_ms_per_step": round(ref * 1e3, 4),
                            f"{candidate}_ms_per_step": round(cand * 1e3, 4),
                            f"{candidate}_speed_vs_{REFERENCE}": round(ref / cand, 4),
                            "runs": {b: len(self.samples[b][r]) for b in (REFERENCE, candidate)}})
        return {"index": self.stage, "layers": [self.layer_start, self.layer_end], "figures": figures,
                "evidence_class": "physical", "figure": FIGURE,
                "measured_on": {"host": self.host, "cpu_model": self.cpu_model,
                                "cpu_quota_cores": self.cpu_quota_cores, "cpuset": self.cpuset,
                                "builds": dict(self.builds), "command": self.command,
                                "context_tokens": self.context_tokens}}


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # the backend the route runs after the decision
    candidate: str  # the backend the switch was asked for
    policy: SwitchPolicy
    reason: str
    rows: tuple[int, ...] = ()
    stages: tuple[StageStepTimes, ...] = ()

    @property
    def switch(self) -> bool:
        return self.backend == self.candidate

    def snapshot(self) -> dict[str, object]:
        return {"backend": self.backend, "candidate": self.candidate, "policy": self.policy.value,
                "reason": self.reason, "rows": list(self.rows),
                "rule": f"switch only if {self.candidate}'s median step <= {REFERENCE}'s on every stage at every "
                        f"measured row count" if self.policy is SwitchPolicy.MEASURED else "forced",
                "stages": [s.snapshot(self.candidate, self.rows) for s in self.stages]}


def forced(candidate: str) -> BackendChoice:
    return BackendChoice(candidate, candidate, SwitchPolicy.ALWAYS,
                         f"forced by max_switch=always: switched to {candidate} without measuring")


def decide(candidate: str, stages: tuple[StageStepTimes, ...], rows: tuple[int, ...]) -> BackendChoice:
    """The measured choice between `candidate` and numpy (see the module doc for the rule)."""
    if not stages or not rows:
        raise FailedPrecondition("no stage step times to decide on", reason="INCOMPLETE_STEP_TIMES")
    slowest: tuple[float, StageStepTimes, int] | None = None  # (candidate / numpy, stage, rows)
    for stage in stages:
        for r in rows:
            ratio = stage.median(candidate, r) / stage.median(REFERENCE, r)
            if slowest is None or ratio > slowest[0]:
                slowest = (ratio, stage, r)
    assert slowest is not None
    ratio, stage, r = slowest
    where = (f"stage {stage.stage} at {r} row{'s' if r != 1 else ''}: {candidate} "
             f"{stage.median(candidate, r) * 1e3:.3f} ms vs {REFERENCE} {stage.median(REFERENCE, r) * 1e3:.3f} ms "
             f"per step on {stage.host} ({stage.cpu_model})")
    if ratio <= 1.0:
        return BackendChoice(candidate, candidate, SwitchPolicy.MEASURED,
                             f"{candidate} measured at least as fast on every stage and row count; the closest: "
                             f"{where}", rows, stages)
    return BackendChoice(REFERENCE, candidate, SwitchPolicy.MEASURED,
                         f"stayed on {REFERENCE}: {candidate} measured {ratio:.2f}x slower at {where}", rows, stages)
