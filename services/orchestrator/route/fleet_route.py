"""Installs a route on the fleet's stage workers and wraps it as a serving engine.

The engine gets a supervisor that watches its stages (DEGRADED on a lost stage) and, when a
stage comes back without the route, reloads the exact stored plan as a new generation so the
engine can replay its suspended requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import structlog

from libs.artifacts.conversions import conversion_summary
from libs.common.kinds import DType
from libs.model.config import load_config
from libs.text.context import TextContext
from services.orchestrator.engine.domain import ServedModel
from services.orchestrator.engine.drift import DriftPolicy, DriftTracker, prediction_basis
from services.orchestrator.engine.model_card import route_card, served_model
from services.orchestrator.engine.serving import ServingConfig, build_engine
from services.orchestrator.route.install import (
    UNIFORM_FP32,
    Fleet,
    InstalledPlan,
    InstallSpec,
    StoredPlan,
    WeightsChoice,
    discard,
    install,
    prepare,
)
from services.orchestrator.route.lifecycle import (
    InstalledRoute,
    Installer,
    InstallRequest,
    PlanIdentity,
    Preparer,
    StageInfo,
)
from services.orchestrator.route.remote_files import check_text_pins, fetch_manifest
from services.orchestrator.route.route_health import HealthPolicy
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.route_supervisor import RouteSupervisor
from services.orchestrator.route.stage_chain import Route, unload_generation
from services.planner.domain import Plan

_log = structlog.get_logger()


def fleet_preparer(fleet: Fleet, state_dir: str, kv_limit_bytes: int,
                   progress: Callable[[str], None],
                   hop_dtypes: tuple[DType, ...] = (), weights: WeightsChoice = UNIFORM_FP32) -> Preparer:
    async def preparer(request: InstallRequest) -> InstallRequest:
        spec = _spec(request, state_dir, kv_limit_bytes, hop_dtypes, weights)
        return replace(request, stored=await prepare(spec, fleet, progress))

    return preparer


def _spec(request: InstallRequest, state_dir: str, kv_limit_bytes: int,
          hop_dtypes: tuple[DType, ...], weights: WeightsChoice) -> InstallSpec:
    return InstallSpec(request.checkpoint_dir, request.stages, request.backend,
                       request.boundary_dtype, Path(state_dir), kv_limit_bytes=kv_limit_bytes,
                       hop_dtypes=hop_dtypes, weights=weights)


def fleet_installer(fleet: Fleet, state_dir: str, model_id: str, kv_limit_bytes: int,
                    serving: ServingConfig, progress: Callable[[str], None],
                    hop_dtypes: tuple[DType, ...] = (),
                    health: HealthPolicy = HealthPolicy(),
                    drift: DriftPolicy = DriftPolicy(),
                    weights: WeightsChoice = UNIFORM_FP32) -> Installer:
    async def installer(request: InstallRequest) -> InstalledRoute:
        spec = _spec(request, state_dir, kv_limit_bytes, hop_dtypes, weights)
        stored = request.stored if isinstance(request.stored, StoredPlan) else None
        if stored is not None:
            progress(f"loading the stored plan {stored.plan.plan_id} (no re-planning)")
        if request.serving_generation:
            progress(f"loading beside the serving plan generation {request.serving_generation}")
        installed, route = await install(spec, fleet, progress, stored, request.serving_generation)
        try:
            served, text = await _served_and_text(fleet, route, installed, request, model_id)
        except BaseException:
            await discard(route, fleet)
            raise
        plan = route.plan
        stages = tuple(StageInfo(s.index, s.control_address, a, b, s.manifest_hash)
                       for s, (a, b) in zip(plan.stages, installed.layer_ranges, strict=True))
        engine = build_engine(serving, RoutePipeline(route, served), text)

        async def reload() -> Route:  # the exact stored plan, as a new generation in place of this one
            return (await install(spec, fleet, progress, installed.stored,
                                  replace_generation=result.plan.plan_generation_id))[1]

        def reloaded(new_route: Route) -> None:
            p = new_route.plan
            result.plan = PlanIdentity(p.plan_id, p.plan_hash, p.plan_generation_id)

        async def retire() -> None:  # this route's current generation, after it drained
            generation = result.plan.plan_generation_id
            outcome = await unload_generation([s.worker_address for s in stages], generation, fleet.channel)
            _log.info("generation_retired", generation=generation, live_sequences=outcome.live_sequences,
                      kv_bytes_used=outcome.kv_bytes_used, unreachable_workers=len(outcome.failures))

        supervisor = RouteSupervisor(engine, route, health, reload,
                                     lambda r: RoutePipeline(r, served), reloaded,
                                     partial(_drift_tracker, installed.plan, drift))
        result = InstalledRoute(replace(request, stored=installed.stored, serving_generation=""),
                                PlanIdentity(plan.plan_id, plan.plan_hash, plan.plan_generation_id),
                                stages, engine, lambda: supervisor.stage_conditions, retire)
        supervisor.start()
        return result

    return installer


async def _served_and_text(fleet: Fleet, route: Route, installed: InstalledPlan, request: InstallRequest,
                           model_id: str) -> tuple[ServedModel, TextContext]:
    """What the installed route serves (its model card and per-stage KV limits) and the text
    context it tokenizes with."""
    # Tokenize with exactly what the artifacts were built from, or refuse to serve.
    manifests = await asyncio.gather(*(fetch_manifest(fleet.artifact_builder, s.manifest_hash, fleet.channel)
                                       for s in route.plan.stages))
    check_text_pins(list(manifests), installed.text_pins)
    text = TextContext.from_checkpoint(installed.model_dir, installed.text_pins)
    # Admission counts against each stage's own KV limit, so an overflow is refused
    # here at once rather than by a stage at prefill.
    # In blocks, as the stages count them (their KV dtype sets the block's bytes).
    healths = await route.health()
    limits = tuple(h.kv_bytes_limit for h in healths)
    blocks = tuple((h.kv_block_tokens, h.kv_blocks_total) for h in healths)
    served = served_model(load_config(installed.model_dir),
                          list(installed.layer_ranges), model_id,
                          stage_kv_budgets=limits if all(limits) else None,
                          stage_kv_blocks=blocks if all(t and n for t, n in blocks) else None)
    card = route_card(installed.plan.model_snapshot, request.backend, request.boundary_dtype,
                      installed.plan.plan_id, installed.plan.mode)
    served = replace(served, card=replace(card, stage_weights=tuple(m.weights_policy for m in manifests),
                                          stage_conversions=tuple(map(conversion_summary, manifests)),
                                          stage_max_activations=tuple(s.max_activations for s in route.plan.stages)))
    return served, text


def _drift_tracker(planned: Plan, drift: DriftPolicy) -> DriftTracker:
    """The installed plan's own per-stage predictions."""
    return DriftTracker(tuple(s.decode.service_s for s in planned.stages),
                        prediction_basis(planned.mode, planned.from_profiles, planned.declared_terms), drift)
