"""Wiring for serve-at-once: which workers run which backend, the background compiler, and the
measured switch decision."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from libs.common.kinds import Backend
from libs.model.layout import even_layer_split
from libs.service.errors import FailedPrecondition
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.route.backend_choice import BackendChoice, StageStepTimes
from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings
from services.orchestrator.route.coldstart import REFERENCE_BACKEND, AfterSwitch, Chooser, CompilerFactory
from services.orchestrator.route.lifecycle import InstallRequest, RouteStatus, StageInfo

Step = TypeVar("Step")


def by_backend(requested: Callable[[InstallRequest], Awaitable[Step]],
               reference: Callable[[InstallRequest], Awaitable[Step]]) -> Callable[[InstallRequest], Awaitable[Step]]:
    """numpy installs (and their planning) go to the reference workers, every other backend to
    the main ones, so both routes can be up at once during a switch."""

    async def step(request: InstallRequest) -> Step:
        return await (reference if request.backend == REFERENCE_BACKEND else requested)(request)

    return step


def switching_stages(cfg: OrchestratorConfig) -> tuple[int, ...]:
    """The stages whose reference worker is not their main worker: those the switch moves. On a
    fleet file a numpy host's own worker is its stage's reference, and nothing moves there."""
    return tuple(i for i, (main, reference) in enumerate(zip(cfg.route.stage_workers,
                                                              cfg.route.reference_stage_workers, strict=True))
                 if main != reference)


def compile_activations(cfg: OrchestratorConfig) -> tuple[str, ...]:
    """The block-format activations the switching stages' MAX workers run, each compiled once."""
    modes = cfg.route.worker_max_activations
    if not modes:
        return ("int8",)
    if len(modes) != len(cfg.route.stage_workers):
        raise FailedPrecondition(f"{len(modes)} max activations for {len(cfg.route.stage_workers)} stage workers",
                                 reason="MAX_ACTIVATIONS_MISMATCH", field="worker_max_activations")
    return tuple(sorted({modes[i] for i in switching_stages(cfg)})) or ("int8",)


def unload_reference(cfg: OrchestratorConfig) -> AfterSwitch | None:
    """Once the route runs on the main workers, the reference workers give their stages back (a
    worker that is both retired the reference generation with the switch: it keeps serving)."""
    if not cfg.route.reference_stage_workers:
        return None
    separate = [cfg.route.reference_stage_workers[i] for i in switching_stages(cfg)]

    async def unload() -> None:
        from fornax.stage_worker.v1 import stage_worker_pb2 as pb
        from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
        from libs.service.channels import open_aio_channel
        from services.orchestrator.route.stage_chain import UNLOAD_TIMEOUT_S

        for address in separate:
            async with open_aio_channel(address, cfg.server.client_channel()) as channel:
                await pb_grpc.StageWorkerServiceStub(channel).UnloadStage(
                    pb.UnloadStageRequest(request_id=str(uuid.uuid4())), timeout=UNLOAD_TIMEOUT_S)

    return unload


def compiler_factory(cfg: OrchestratorConfig) -> CompilerFactory | None:
    """None when there are no reference workers to serve on while compiling."""
    if not cfg.route.reference_stage_workers:
        return None
    if len(cfg.route.reference_stage_workers) != len(cfg.route.stage_workers):
        raise FailedPrecondition(
            f"{len(cfg.route.reference_stage_workers)} reference workers for {len(cfg.route.stage_workers)} stages",
            reason="REFERENCE_WORKERS_MISMATCH", field="reference_stage_workers")
    from libs.model.max_kernels import default_cache_dir, max_build

    cache_dir = Path(cfg.route.compile_cache_dir) if cfg.route.compile_cache_dir else default_cache_dir()

    def make(request: InstallRequest) -> BackgroundCompiler:
        from libs.model.config import load_config

        layers = load_config(request.checkpoint_dir).num_hidden_layers
        # The planner places layers later; graph kinds only differ at the ends (embed, final),
        # so compiles start from an even split at once instead of waiting for the plan.
        ranges = tuple(even_layer_split(layers, request.stages))
        settings = CompileSettings(request.checkpoint_dir, cache_dir, max_build(),
                                   stage_cpus=cfg.route.stage_cpu_sets, weights_policy=cfg.route.weights_policy,
                                   activations=compile_activations(cfg))
        return BackgroundCompiler(settings, ranges, compiled_stages=switching_stages(cfg))

    return make


def switch_candidate(request: InstallRequest) -> str:
    """The backend the route may move to: the requested one, or on a fleet file, where each stage
    runs its own host's backend (no backend requested), MAX, the one backend besides numpy."""
    return str(request.backend) if request.backend is not None else Backend.MAX.value


COMPARE_TIMEOUT_S = 900.0  # loading a stage's cached MAX graphs, then both backends' runs


def chooser(cfg: OrchestratorConfig) -> Chooser:
    """The switch decision for a route on the main workers: forced, or measured by each stage's
    main worker on its own host (CompareDecodeStep), one stage at a time so stages that share
    CPUs do not time each other."""
    from services.orchestrator.route.backend_choice import SwitchPolicy, decide, forced

    async def choose_forced(request: InstallRequest, serving: RouteStatus) -> BackendChoice:
        return forced(switch_candidate(request))

    async def choose_measured(request: InstallRequest, serving: RouteStatus) -> BackendChoice:
        policies = (cfg.route.weights_policy, *cfg.route.worker_weights)
        if any(policy != "fp32" for policy in policies):
            raise FailedPrecondition(
                f"the switch is measured on float32 weights; weight policy {', '.join(sorted(set(policies)))} is "
                "not measured (max_switch=always switches without measuring)",
                reason="SWITCH_NOT_MEASURABLE", field="weights_policy")
        if len(serving.stages) != len(cfg.route.stage_workers):
            raise FailedPrecondition(f"the serving route has {len(serving.stages)} stages for "
                                     f"{len(cfg.route.stage_workers)} workers", reason="SWITCH_NOT_MEASURABLE")
        stages = []
        for index in switching_stages(cfg):  # a stage that stays on its worker has nothing to compare
            stages.append(await _compare_on(cfg, cfg.route.stage_workers[index], serving.stages[index],
                                            request.checkpoint_dir, cfg.route.max_switch_rows))
        return decide(switch_candidate(request), tuple(stages), cfg.route.max_switch_rows)

    if cfg.route.max_switch is SwitchPolicy.ALWAYS:
        return Chooser(False, choose_forced)
    return Chooser(True, choose_measured)


async def _compare_on(cfg: OrchestratorConfig, address: str, stage: StageInfo, checkpoint: str,
                      rows: tuple[int, ...]) -> StageStepTimes:
    """The stage's main worker times the stage the reference route serves: its built artifact
    when it has one (fetched from the builder), else its checkpoint layer range."""
    from fornax.common.v1 import common_pb2 as common_pb
    from fornax.stage_worker.v1 import stage_worker_pb2 as pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
    from libs.service.channels import open_aio_channel

    start, end = stage.layer_start, stage.layer_end
    if stage.manifest_hash and cfg.route.artifact_builder_addr:
        compare = pb.CompareDecodeStepRequest(artifact_source_address=cfg.route.artifact_builder_addr,
                                              manifest_hash=stage.manifest_hash)
    else:
        compare = pb.CompareDecodeStepRequest(
            checkpoint_dir=checkpoint, layer_range=common_pb.LayerRange(layer_start=start, layer_end_exclusive=end))
    compare.request_id, compare.rows[:] = str(uuid.uuid4()), list(rows)
    async with open_aio_channel(address, cfg.server.client_channel()) as channel:
        reply = await pb_grpc.StageWorkerServiceStub(channel).CompareDecodeStep(compare, timeout=COMPARE_TIMEOUT_S)
    return step_times_from_pb(stage.index, start, end, reply)


def step_times_from_pb(index: int, start: int, end: int, reply) -> StageStepTimes:
    samples: dict[str, dict[int, tuple[float, ...]]] = {}
    builds: dict[str, str] = {}
    for timing in reply.timings:
        samples.setdefault(timing.backend, {})[timing.rows] = tuple(timing.seconds_per_step)
        builds[timing.backend] = timing.backend_build
    return StageStepTimes(index, start, end, reply.host, reply.cpu_model, reply.cpu_quota_cores, reply.cpuset,
                          reply.command, reply.context_tokens, builds, samples)
