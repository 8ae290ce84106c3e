"""The live dashboard's data: a sampler that keeps the last minutes of fleet figures.

Pure: each `record` takes one sample (time, counters, per-stage totals) and the state turns
cumulative counters into rates and per-batch means over the last sample interval. The shell
(`dashboard.py`) feeds it once a second and serves `snapshot()` as JSON. Every figure is
physical (measured on the fleet's own clocks) except the plan's, which are predictions.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from services.orchestrator.engine.domain import ServedModel, StageStats
from services.orchestrator.engine.drift import RouteCalibration

HISTORY_SAMPLES = 300  # five minutes at one sample a second
ERROR_WINDOW_S = 300.0
_PHASES = ("queue", "compute", "pack", "transfer", "unpack")


@dataclass(frozen=True)
class Sample:
    t_s: float  # monotonic seconds
    tokens_total: int
    live_requests: int
    finished_by_reason: dict[str, int]
    stages: tuple[StageStats, ...]


class DashboardState:
    def __init__(self) -> None:
        self._history: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=HISTORY_SAMPLES)  # (t, tokens/s, live requests)
        self._previous: Sample | None = None
        self._stage_means: dict[int, dict[str, float | None]] = {}
        self._errors: collections.deque[tuple[float, str]] = collections.deque(maxlen=4096)

    def record(self, sample: Sample) -> None:
        before = self._previous
        if before is not None and sample.t_s > before.t_s:
            rate = max(0, sample.tokens_total - before.tokens_total) / (sample.t_s - before.t_s)
            self._history.append((sample.t_s, rate, sample.live_requests))
            self._stage_means = {s.index: _phase_means(_match(before, s), s) for s in sample.stages}
            for reason, count in sample.finished_by_reason.items():
                for _ in range(max(0, count - before.finished_by_reason.get(reason, 0))):
                    self._errors.append((sample.t_s, reason))
        self._previous = sample

    def error(self, t_s: float, reason: str) -> None:
        """An error answered to a client (an HTTP error body) with its reason code."""
        self._errors.append((t_s, reason))

    def snapshot(self, served: ServedModel | None, now_s: float,
                 calibration: RouteCalibration | None = None) -> dict:
        latest = self._previous
        recent = collections.Counter(r for t, r in self._errors if now_s - t <= ERROR_WINDOW_S)
        return {
            "route": None if served is None else _route(served, latest),
            "calibration": None if calibration is None else calibration_view(calibration),
            "tokens_per_s": [round(r, 3) for _, r, _ in self._history],
            "active_requests": [n for _, _, n in self._history],
            "live_requests": latest.live_requests if latest else 0,
            "tokens_total": latest.tokens_total if latest else 0,
            "errors": dict(sorted(recent.items())),
            "error_window_s": ERROR_WINDOW_S,
            "stages": [] if latest is None else [
                _stage(s, self._stage_means.get(s.index, {})) for s in latest.stages],
        }


def _match(sample: Sample, stage: StageStats) -> StageStats | None:
    return next((s for s in sample.stages if s.index == stage.index), None)


def _phase_means(before: StageStats | None, now: StageStats) -> dict[str, float | None]:
    """Mean ms per batch of each phase over the interval; None when no batch ran in it."""
    batches = now.batches - (before.batches if before else 0)
    if batches <= 0:
        return dict.fromkeys(_PHASES)
    return {p: (getattr(now, f"{p}_ns") - (getattr(before, f"{p}_ns") if before else 0))
            / batches / 1e6 for p in _PHASES}


def _hit_rate(stats: StageStats) -> float | None:
    """Share of looked-up prefix blocks found resident since the stage loaded; None before any."""
    looked = stats.prefix_hit_blocks + stats.prefix_missed_blocks
    return stats.prefix_hit_blocks / looked if looked else None


def _stage(stats: StageStats, means: dict[str, float | None]) -> dict:
    return {"index": stats.index, "host": stats.host, "kv_bytes_used": stats.kv_bytes_used,
            "kv_bytes_limit": stats.kv_bytes_limit, "live_sequences": stats.live_sequences,
            "kv_blocks_free": stats.kv_blocks_free, "kv_blocks_total": stats.kv_blocks_total,
            "prefix_hit_rate": _hit_rate(stats), "kv_evicted_blocks": stats.kv_evicted_blocks,
            "batches": stats.batches, "phase_ms": {p: means.get(p) for p in _PHASES},
            "phase_total_ms": {p: getattr(stats, f"{p}_ns") / 1e6 for p in _PHASES}}


def _route(served: ServedModel, latest: Sample | None) -> dict:
    card = served.card
    hosts = {s.index: s.host for s in latest.stages} if latest else {}
    return {"model": served.model_id, "plan_id": card.plan_id, "plan_mode": card.plan_mode,
            "plan_evidence": card.plan_evidence.value,
            "execution_evidence": card.execution_evidence.value,
            "backend": card.backend, "boundary_dtype": card.boundary_dtype,
            "model_snapshot": card.model_snapshot,
            "stages": [{"index": i, "host": hosts.get(i, ""), "backend": card.backend,
                        "layer_start": s.layer_start, "layer_end_exclusive": s.layer_end}
                       for i, s in enumerate(served.stages)]}


def calibration_view(calibration: RouteCalibration) -> dict:
    """Per stage the plan's prediction and the physical measurement, each labelled as such."""
    return {"state": calibration.state.value, "reason": calibration.reason,
            "prediction_basis": calibration.prediction_basis, "relative_bound": calibration.relative_bound,
            "stages": [{"index": s.index, "state": s.state.value,
                        "predicted_decode_service_s": s.predicted_s,
                        "measured_decode_service_s": s.measured.recent_decode_service_s
                        if s.measured and s.measured.recent_microbatches else None,
                        "measured_microbatches": s.measured.recent_microbatches if s.measured else 0,
                        "relative_error": s.relative_error} for s in calibration.stages]}
