"""Compile a route's MAX graphs in the background while the reference backend serves.

Every graph kind the route needs is compiled once (one compiled graph serves every stage and
layer of its kind), by a process pinned to the CPU share of a stage that needs it, at low
priority (`libs.model.compile_job`). A stage whose share has more than one CPU compiles that
many of its graphs at once. Graphs already in the compile cache are not compiled again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import structlog

from libs.model.compile_cache import (
    GraphName,
    GraphTarget,
    assign_compiles,
    config_sha256,
    is_cached,
    stage_graphs,
)
from libs.model.config import load_config
from libs.model.graph_variants import checkpoint_graph_variants
from libs.service.affinity import format_cpu_set

_log = structlog.get_logger()


class GraphState(Enum):
    CACHED = "cached"  # found in the compile cache; nothing to do
    QUEUED = "queued"
    COMPILING = "compiling"
    DONE = "done"
    FAILED = "failed"


@dataclass
class GraphProgress:
    name: GraphName
    stage_index: int  # the stage whose CPU share compiles it
    state: GraphState
    seconds: float | None = None  # physical: wall seconds of this compile on this host
    error: str = ""


@dataclass(frozen=True)
class CompileSettings:
    checkpoint_dir: str
    cache_dir: Path
    build: str  # the MAX build the stage workers run, e.g. "max 26.7.0"
    device: str = "cpu"
    weight_dtype: str = "float32"
    # CPU share of each stage, in stage order; empty = the compile inherits this process's.
    stage_cpus: tuple[tuple[int, ...], ...] = ()
    # The MAX stages' weight policy: its block formats make graph variants of their own (a GGUF
    # checkpoint's stored formats make them, under the default policy).
    weights_policy: str = "fp32"
    # The MAX stages' block-format activations (`MaxOptions.block_activations`), each compiled:
    # the graphs differ by mode, so a warm cache for another mode would not serve the route.
    activations: tuple[str, ...] = ("int8",)


@dataclass
class BackgroundCompiler:
    settings: CompileSettings
    stage_ranges: tuple[tuple[int, int], ...]  # [layer_start, layer_end) per stage
    # The stages that will run MAX (None: every stage); a fleet file's numpy hosts need no graph.
    compiled_stages: tuple[int, ...] | None = None
    graphs: dict[GraphName, GraphProgress] = field(default_factory=dict)
    stage_needs: tuple[tuple[GraphName, ...], ...] = ()
    _processes: set[asyncio.subprocess.Process] = field(default_factory=set)

    def __post_init__(self) -> None:
        cfg = load_config(self.settings.checkpoint_dir)
        count = len(self.stage_ranges)
        self.stage_needs = tuple(
            stage_graphs(cfg, a, b, i == 0, i == count - 1)
            if self.compiled_stages is None or i in self.compiled_stages else ()
            for i, (a, b) in enumerate(self.stage_ranges))
        config_hash = config_sha256(cfg)
        variants = checkpoint_graph_variants(Path(self.settings.checkpoint_dir), cfg, self.settings.weights_policy)
        dtype = variants.weight_dtype if variants else self.settings.weight_dtype
        for stage, names in enumerate(assign_compiles(list(self.stage_needs))):
            for name in names:
                quants = variants.quant.get(name, ((),)) if variants else ((),)
                cached = all(is_cached(self.settings.cache_dir, GraphTarget(
                    name, self.settings.build, self.settings.device, dtype, config_hash, quant, mode))
                    for quant in quants for mode in self.settings.activations)
                self.graphs[name] = GraphProgress(name, stage, GraphState.CACHED if cached else GraphState.QUEUED)

    def all_cached(self) -> bool:
        return all(g.state is GraphState.CACHED for g in self.graphs.values())

    def failure(self) -> str:
        failed = [g for g in self.graphs.values() if g.state is GraphState.FAILED]
        return "; ".join(f"MAX compile of the {g.name.value} graph failed: {g.error}" for g in failed)

    def stage_graph_states(self, stage_index: int) -> dict[str, str]:
        return {name.value: self.graphs[name].state.value for name in self.stage_needs[stage_index]}

    async def run(self) -> bool:
        """Compiles every graph not cached; True when all of them are ready."""
        stages = range(len(self.stage_ranges))
        await asyncio.gather(*(self._run_stage(i) for i in stages))
        return all(g.state in (GraphState.CACHED, GraphState.DONE) for g in self.graphs.values())

    async def stop(self) -> None:
        for process in list(self._processes):
            if process.returncode is None:
                process.kill()
                await process.wait()

    async def _run_stage(self, stage_index: int) -> None:
        cpus = self._cpus(stage_index)
        slots = asyncio.Semaphore(max(1, len(cpus)))
        mine = [g for g in self.graphs.values() if g.stage_index == stage_index and g.state is GraphState.QUEUED]
        await asyncio.gather(*(self._compile(g, cpus, slots) for g in mine))

    def _cpus(self, stage_index: int) -> tuple[int, ...]:
        shares = self.settings.stage_cpus
        return shares[stage_index] if stage_index < len(shares) else ()

    async def _compile(self, graph: GraphProgress, cpus: tuple[int, ...], slots: asyncio.Semaphore) -> None:
        async with slots:
            graph.state = GraphState.COMPILING
            _log.info("compile_started", graph=graph.name.value, stage=graph.stage_index, cpus=list(cpus))
            result = await self._spawn(graph.name, cpus)
        if result.get("state") == "done":
            graph.state, graph.seconds = GraphState.DONE, float(result.get("seconds", 0.0))
            _log.info("compile_done", graph=graph.name.value, seconds=graph.seconds,
                      figure="physical: wall seconds on this host, low priority")
        else:
            graph.state, graph.error = GraphState.FAILED, str(result.get("error", "no result"))
            _log.error("compile_failed", graph=graph.name.value, error=graph.error)

    async def _spawn(self, name: GraphName, cpus: tuple[int, ...]) -> dict[str, Any]:
        s = self.settings
        argv = [sys.executable, "-m", "libs.model.compile_job", "--checkpoint", s.checkpoint_dir,
                "--graph", name.value, "--cache-dir", str(s.cache_dir), "--device", s.device,
                "--weight-dtype", s.weight_dtype, "--weights", s.weights_policy,
                "--activations", ",".join(s.activations)]
        if cpus:
            argv += ["--cpus", format_cpu_set(cpus)]
        process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                       stdin=asyncio.subprocess.DEVNULL)
        self._processes.add(process)
        try:
            stdout, _ = await process.communicate()
        finally:
            self._processes.discard(process)
        return _last_json_line(stdout, process.returncode)


def _last_json_line(stdout: bytes, returncode: int | None) -> dict[str, object]:
    for line in reversed(stdout.decode("utf-8", errors="replace").splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            return parsed
    return {"state": "failed", "error": f"the compile process exited with {returncode} and no result"}
