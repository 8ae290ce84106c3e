"""CompareDecodeStep: time one stage's served decode step on numpy and on this worker's own
backend, in this process, with the same weights.

The orchestrator decides a live switch to MAX on these figures (`services.orchestrator.
backend_choice`). They are taken here, not in the orchestrator, because this process runs in
the stage host's CPU share (its cgroup and cpuset): the figures are the host's. Both backends
run the exact served path (`step_profile._ServedSteps`: executor run, sampling on the head
stage, KV commit, boundary pack), over the same loaded weights, and the runs alternate
backends so drift on a shared host lands on both.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.model.config import DeepseekV2Config, load_config
from libs.model.errors import ModelError
from libs.model.executor import StageSpec
from libs.model.kernels import StageKernels, make_kernels
from libs.model.weights import load_stage_weights
from libs.security.paths import confine
from libs.service.cgroup_facts import cgroup_facts
from libs.service.errors import FailedPrecondition, InvalidArgument
from libs.service.host import backend_build, host_facts
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.runtime import StageRuntime
from services.stage_worker.step_profile import KV_LIMIT_BYTES, _ServedSteps

log = structlog.get_logger()
Clock = Callable[[], float]
REFERENCE = "numpy"
DEFAULT_CONTEXT = 32
DEFAULT_RUNS = 5
MAX_RUNS = 50
DEFAULT_MIN_RUN_MS = 50
MAX_MIN_RUN_MS = 2000
MAX_ROWS = 1024
MAX_ROW_COUNTS = 8
MAX_STEPS_PER_RUN = 32  # the KV past grows by one token per step; keep it near `context`
COMMAND = "StageWorkerService/CompareDecodeStep"


@dataclass(frozen=True)
class StepGrid:
    rows: tuple[int, ...]
    context: int
    runs: int
    min_run_s: float


def grid_from(request: pb.CompareDecodeStepRequest) -> StepGrid:
    rows = tuple(sorted(set(request.rows)))
    if not rows:
        raise InvalidArgument("rows is required", reason="MISSING_FIELD", field="rows")
    if rows[0] < 1 or rows[-1] > MAX_ROWS or len(rows) > MAX_ROW_COUNTS:
        raise InvalidArgument(f"rows must be at most {MAX_ROW_COUNTS} values in [1, {MAX_ROWS}], got {list(rows)}",
                              reason="INVALID_GRID", field="rows")
    runs = request.runs or DEFAULT_RUNS
    if runs > MAX_RUNS:
        raise InvalidArgument(f"runs must be at most {MAX_RUNS}", reason="INVALID_GRID", field="runs")
    min_run_ms = request.min_run_ms or DEFAULT_MIN_RUN_MS
    if min_run_ms > MAX_MIN_RUN_MS:
        raise InvalidArgument(f"min_run_ms must be at most {MAX_MIN_RUN_MS}", reason="INVALID_GRID",
                              field="min_run_ms")
    context = request.context_tokens or DEFAULT_CONTEXT
    if context > 131072:
        raise InvalidArgument("context_tokens must be at most 131072", reason="INVALID_GRID", field="context_tokens")
    return StepGrid(rows, context, runs, min_run_ms / 1000)


def time_steps(cfg: DeepseekV2Config, kernels: dict[str, StageKernels], spec: StageSpec, grid: StepGrid,
               clock: Clock = time.perf_counter) -> dict[str, dict[int, list[float]]]:
    """Blocking: seconds per served decode step, backend -> rows -> one sample per run. Each run
    starts from fresh KV at `grid.context` tokens; backends alternate within every run."""
    out: dict[str, dict[int, list[float]]] = {name: {} for name in kernels}
    for rows in grid.rows:
        steps = {}
        for name, stage_kernels in kernels.items():  # a warm step, and how many fit a run
            warm = _ServedSteps(cfg, stage_kernels, spec, rows, grid.context, run=0)
            start = clock()
            warm.step()
            first_s = max(clock() - start, 1e-9)
            steps[name] = max(1, min(MAX_STEPS_PER_RUN, int(grid.min_run_s / first_s)))
        for run in range(1, grid.runs + 1):
            for name, stage_kernels in kernels.items():
                served = _ServedSteps(cfg, stage_kernels, spec, rows, grid.context, run)
                start = clock()
                for _ in range(steps[name]):
                    served.step()
                out[name].setdefault(rows, []).append((clock() - start) / steps[name])
    return out


def _measure(checkpoint: str, layer_start: int, layer_end: int, backend: str, device: str, grid: StepGrid,
             options: object | None) -> tuple[DeepseekV2Config, dict[str, dict[int, list[float]]]]:
    cfg = load_config(checkpoint)
    first, last = layer_start == 0, layer_end == cfg.num_hidden_layers
    weights = load_stage_weights(checkpoint, cfg, layer_start, layer_end, first, last)
    kernels = {REFERENCE: make_kernels(REFERENCE, cfg, weights, device),
               backend: make_kernels(backend, cfg, weights, device, options)}
    spec = StageSpec(layer_start, layer_end, first, last, KV_LIMIT_BYTES)
    return cfg, time_steps(cfg, kernels, spec, grid)


def timings_to_pb(samples: dict[str, dict[int, list[float]]], builds: dict[str, str]) -> list[pb.DecodeStepTiming]:
    return [pb.DecodeStepTiming(backend=name, backend_build=builds[name], rows=rows, seconds_per_step=values)
            for name, by_rows in samples.items() for rows, values in sorted(by_rows.items())]


def timed_builds(builds: dict[str, str | None], backend: str, max_activations: str) -> dict[str, str]:
    """Each backend's build as timed: a max build names the block-format activations its graphs
    ran in (an int8 and a float32 step of one host are different measurements)."""
    return {name: f"{build} ({max_activations} activations)" if name == backend == "max" else str(build)
            for name, build in builds.items()}


class DecodeStepComparer:
    """The servicer's CompareDecodeStep half: one per worker."""

    def __init__(self, cfg: StageWorkerConfig, runtime: Callable[[], StageRuntime | None],
                 busy: Callable[[], Sequence[str]]):
        self._cfg = cfg
        self._runtime = runtime  # any runtime: they share the device thread, artifact cache, fetch channel
        self._busy = busy

    async def compare(self, request: pb.CompareDecodeStepRequest) -> pb.CompareDecodeStepResponse:
        backend = self._cfg.backend.value
        if backend == REFERENCE:
            raise FailedPrecondition("this worker runs numpy, the backend it would be compared against",
                                     reason="NOTHING_TO_COMPARE")
        grid = grid_from(request)
        if bool(request.checkpoint_dir) == bool(request.artifact_source_address):
            raise InvalidArgument("give exactly one of checkpoint_dir or artifact_source_address",
                                  reason="INVALID_SOURCE", field="checkpoint_dir")
        busy = self._busy()
        if busy:
            raise FailedPrecondition(f"the worker is {busy[0]}; compare it idle", reason="STAGE_BUSY")
        builds = {name: backend_build(name) for name in (REFERENCE, backend)}
        missing = [name for name, build in builds.items() if build is None]
        if missing:
            raise FailedPrecondition(f"backend {missing[0]} is not installed", reason="BACKEND_UNAVAILABLE")
        options = None
        if backend == "max":
            from libs.model.max_kernels import MaxOptions
            from services.stage_worker.runtime import _compile_progress

            options = MaxOptions(device=self._cfg.device, block_activations=self._cfg.max_activations,
                                 progress=_compile_progress)
        directory, start, end = await self._source(request)
        runtime = self._runtime()
        loop = asyncio.get_running_loop()
        try:
            _, samples = await loop.run_in_executor(runtime.device_thread if runtime else None, _measure,
                                                    directory, start, end, backend, self._cfg.device, grid, options)
        except ModelError as exc:
            raise FailedPrecondition(f"{exc.reason}: {exc.message}", reason="COMPARE_LOAD_FAILED") from exc
        limits = cgroup_facts()
        log.info("decode_step_compared", layers=[start, end], rows=list(grid.rows), runs=grid.runs)
        return pb.CompareDecodeStepResponse(
            timings=timings_to_pb(samples, timed_builds(builds, backend, self._cfg.max_activations)),
            host=socket.gethostname(),
            cpu_model=host_facts().cpu_name, cpu_quota_cores=limits.cpu_quota_cores, cpuset=limits.cpuset,
            context_tokens=grid.context, command=COMMAND)

    async def _source(self, request: pb.CompareDecodeStepRequest) -> tuple[str, int, int]:
        """The weights directory and the layer range [start, end) to time."""
        if request.artifact_source_address:
            return await self._artifact(request)
        directory = confine(request.checkpoint_dir, self._cfg.read_roots, "checkpoint_dir")
        start, end = request.layer_range.layer_start, request.layer_range.layer_end_exclusive
        try:
            layers = load_config(str(directory)).num_hidden_layers
        except (ModelError, ValueError) as exc:
            raise InvalidArgument(f"not a checkpoint: {exc}", reason="INVALID_CHECKPOINT",
                                  field="checkpoint_dir") from exc
        if not 0 <= start < end <= layers:
            raise InvalidArgument(f"layer range [{start}, {end}) is outside the model's {layers} layers",
                                  reason="INVALID_LAYER_RANGE", field="layer_range")
        return str(directory), start, end

    async def _artifact(self, request: pb.CompareDecodeStepRequest) -> tuple[str, int, int]:
        from libs.artifacts.verify import verify_artifact
        from services.stage_worker.fetch import fetch_artifact

        if not request.manifest_hash:
            raise InvalidArgument("artifact_source_address needs manifest_hash", reason="MISSING_FIELD",
                                  field="manifest_hash")
        runtime = self._runtime()
        if runtime is None or runtime.artifact_cache is None:
            raise FailedPrecondition("this worker has no state directory to fetch artifacts into",
                                     reason="NO_ARTIFACT_CACHE", field="artifact_source_address")
        local = await fetch_artifact(request.artifact_source_address, request.manifest_hash, runtime.artifact_cache,
                                     config=runtime.fetch_channel)
        verified = await asyncio.to_thread(verify_artifact, local, expected_manifest_hash=request.manifest_hash)
        manifest = verified.manifest
        if manifest.weights_policy != "fp32":  # both backends are timed on float32 weights
            raise FailedPrecondition(f"artifact {request.manifest_hash} holds {manifest.weights_policy} weights; "
                                     "only fp32 stages are compared", reason="SWITCH_NOT_MEASURABLE",
                                     field="manifest_hash")
        return str(local), manifest.layers.layer_start, manifest.layers.layer_end
