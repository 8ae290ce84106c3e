"""Cumulative time per data-plane phase of one stage: the Prometheus histograms, plus running
totals that GetHealth reports so the orchestrator (and its dashboard) can show per-stage
queue, compute, pack, transfer and unpack time without scraping every worker."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from services.stage_worker import metrics
from services.stage_worker.occupancy import Occupancy


class Phase(enum.Enum):
    QUEUE = "queue"
    COMPUTE = "compute"
    PACK = "pack"
    TRANSFER = "transfer"
    UNPACK = "unpack"


_HISTOGRAMS = {Phase.QUEUE: metrics.QUEUE, Phase.COMPUTE: metrics.COMPUTE, Phase.PACK: metrics.PACK,
               Phase.TRANSFER: metrics.TRANSFER, Phase.UNPACK: metrics.UNPACK}
_WITH_STEP_PHASE = {Phase.QUEUE, Phase.COMPUTE}  # labelled by prefill/decode too


@dataclass
class PhaseTotals:
    total_ns: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(Phase, 0))
    count: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(Phase, 0))
    occupancy: Occupancy = field(default_factory=Occupancy)

    def observe(self, phase: Phase, seconds: float, stage_label: str, step: str | None = None) -> None:
        labels = (stage_label, step) if phase in _WITH_STEP_PHASE else (stage_label,)
        _HISTOGRAMS[phase].labels(*labels).observe(seconds)
        self.total_ns[phase] += int(seconds * 1e9)
        self.count[phase] += 1
