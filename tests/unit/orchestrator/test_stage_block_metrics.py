"""Each stage's prefix hits, misses and evictions reach the orchestrator's /metrics (as counters
per stage), its dashboard and `fornax status` (as a hit rate)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client import REGISTRY, generate_latest

from services.orchestrator.api.dashboard import take_sample
from services.orchestrator.api.dashboard_state import DashboardState
from services.orchestrator.engine.domain import EngineSnapshot, ServedModel, StageLayout, StageStats
from services.orchestrator.engine.route_slot import RouteSlot

NAMES = ("fornax_orchestrator_stage_prefix_hit_blocks_total", "fornax_orchestrator_stage_prefix_missed_blocks_total",
         "fornax_orchestrator_stage_kv_evicted_blocks_total")


class _Stages:
    """A pipeline whose stages report the running totals a test sets."""

    def __init__(self) -> None:
        self.totals = {8: (0, 0, 0), 9: (0, 0, 0)}
        self.host = "h"

    async def stage_stats(self) -> list[StageStats]:
        return [StageStats(i, f"{self.host}:{i}", 0, 1 << 20, 0, 0, kv_blocks_free=60, kv_blocks_total=64,
                           prefix_hit_blocks=h, prefix_missed_blocks=m, kv_evicted_blocks=e)
                for i, (h, m, e) in self.totals.items()]


def _exported(stage: int) -> tuple[float, ...]:
    text = generate_latest(REGISTRY).decode()
    values = []
    for name in NAMES:
        line = next((ln for ln in text.splitlines() if ln.startswith(f'{name}{{stage="{stage}"}}')), None)
        values.append(0.0 if line is None else float(line.split()[-1]))
    return tuple(values)


def _engine(stages: _Stages) -> SimpleNamespace:
    """What the dashboard reads of an engine (its EngineClient surface), over `stages`."""
    return SimpleNamespace(stage_stats=stages.stage_stats, snapshot=lambda: EngineSnapshot(0, None, None))


def test_stage_hits_misses_and_evictions_are_exported_as_counters_per_stage():
    stages = _Stages()
    route = RouteSlot(_engine(stages))  # type: ignore[arg-type]
    before = {i: _exported(i) for i in (8, 9)}

    def grew(stage: int) -> tuple[float, ...]:
        return tuple(a - b for a, b in zip(_exported(stage), before[stage], strict=True))

    stages.totals = {8: (6, 2, 1), 9: (0, 5, 0)}
    asyncio.run(take_sample(route))
    assert (grew(8), grew(9)) == ((6, 2, 1), (0, 5, 0))
    asyncio.run(take_sample(route))  # nothing new on the stages: nothing added
    assert (grew(8), grew(9)) == ((6, 2, 1), (0, 5, 0))
    stages.totals = {8: (10, 3, 4), 9: (1, 5, 0)}
    asyncio.run(take_sample(route))
    assert (grew(8), grew(9)) == ((10, 3, 4), (1, 5, 0))
    # Stage 8 restarts (its totals start again): its counters keep growing, never shrink.
    stages.totals = {8: (2, 1, 0), 9: (1, 5, 0)}
    asyncio.run(take_sample(route))
    assert grew(8) == (12, 4, 4)


def test_the_dashboard_shows_each_stages_hit_rate_and_evictions():
    stages = _Stages()
    stages.totals = {8: (6, 2, 1), 9: (0, 0, 0)}
    sample = asyncio.run(take_sample(RouteSlot(_engine(stages))))  # type: ignore[arg-type]
    assert sample is not None
    state = DashboardState()
    state.record(sample)
    served = ServedModel("m", 4096, 512, (StageLayout(0, 2, 10), StageLayout(2, 4, 10)))
    by_index = {s["index"]: s for s in state.snapshot(served, sample.t_s)["stages"]}
    assert (by_index[8]["prefix_hit_rate"], by_index[8]["kv_evicted_blocks"]) == (0.75, 1)
    assert by_index[9]["prefix_hit_rate"] is None
