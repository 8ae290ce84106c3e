"""Installs a route on the fleet's stage workers and wraps it as a serving engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from libs.artifacts.manifest import (
    MANIFEST_FILE,
    artifact_dir_name,
    decode_manifest,
    manifest_hash,
)
from services.orchestrator.stage_chain import Route, RoutePlan
from libs.model.config import load_config
from libs.service.errors import FailedPrecondition
from libs.text.context import TextContext, TextPins
from services.orchestrator.install import Fleet, InstallSpec, StoredPlan, install, prepare
from services.orchestrator.lifecycle import (
    InstalledRoute,
    Installer,
    InstallRequest,
    PlanIdentity,
    Preparer,
    StageInfo,
)
from services.orchestrator.route_health import HealthPolicy
from services.orchestrator.route_supervisor import RouteSupervisor
from services.orchestrator.model_card import served_model
from services.orchestrator.route_pipeline import RoutePipeline
from services.orchestrator.serving import ServingConfig, ServingEngine


def fleet_preparer(fleet: Fleet, artifact_store: str, kv_limit_bytes: int,
                   progress: Callable[[str], None]) -> Preparer:
    async def preparer(request: InstallRequest) -> InstallRequest:
        stored = await prepare(_spec(request, artifact_store, kv_limit_bytes), fleet, progress)
        return replace(request, stored=stored)

    return preparer


def _spec(request: InstallRequest, artifact_store: str, kv_limit_bytes: int) -> InstallSpec:
    return InstallSpec(request.checkpoint_dir, request.stages, request.backend,
                       request.boundary_dtype, artifact_store, kv_limit_bytes=kv_limit_bytes)


def fleet_installer(fleet: Fleet, artifact_store: str, model_id: str, kv_limit_bytes: int,
                    serving: ServingConfig, progress: Callable[[str], None],
                    health: HealthPolicy = HealthPolicy()) -> Installer:
    async def installer(request: InstallRequest) -> InstalledRoute:
        spec = _spec(request, artifact_store, kv_limit_bytes)
        stored = request.stored if isinstance(request.stored, StoredPlan) else None
        if stored is not None:
            progress(f"loading the stored plan {stored.plan.plan_id} (no re-planning)")
        installed, route = await install(spec, fleet, progress, stored)
        try:
            # Tokenize with exactly what the artifacts were built from, or refuse to serve.
            text = TextContext.from_checkpoint(request.checkpoint_dir,
                                               manifest_text_pins(artifact_store, route.plan))
            # Admission counts against each stage's own KV limit, so an overflow is refused
            # here at once rather than by a stage at prefill.
            limits = tuple(h.kv_bytes_limit for h in await route.health())
            served = served_model(load_config(request.checkpoint_dir),
                                  list(installed.layer_ranges), model_id,
                                  stage_kv_budgets=limits if all(limits) else None)
        except BaseException:
            await route.close()
            raise
        plan = route.plan
        stages = tuple(StageInfo(s.index, s.control_address, a, b, s.manifest_hash)
                       for s, (a, b) in zip(plan.stages, installed.layer_ranges))
        engine = ServingEngine(RoutePipeline(route, served), served, text, serving)

        async def reload() -> Route:  # the exact stored plan, as a new generation
            return (await install(spec, fleet, progress, installed.stored))[1]

        def reloaded(new_route: Route) -> None:
            p = new_route.plan
            result.plan = PlanIdentity(p.plan_id, p.plan_hash, p.plan_generation_id)

        supervisor = RouteSupervisor(engine, route, health, reload,
                                     lambda r: RoutePipeline(r, served), reloaded)
        result = InstalledRoute(replace(request, stored=installed.stored),
                                PlanIdentity(plan.plan_id, plan.plan_hash, plan.plan_generation_id),
                                stages, engine, lambda: supervisor.stage_conditions)
        supervisor.start()
        return result

    return installer


def manifest_text_pins(artifact_store: str, plan: RoutePlan) -> TextPins:
    """The tokenizer and template hashes every loaded stage's manifest records."""
    seen = set()
    for stage in plan.stages:
        path = (Path(artifact_store) / "artifacts" / artifact_dir_name(stage.manifest_hash)
                / MANIFEST_FILE)
        manifest = decode_manifest(path.read_bytes())
        if manifest_hash(manifest) != stage.manifest_hash:
            raise FailedPrecondition(f"{path} does not hash to {stage.manifest_hash}",
                                     reason="ARTIFACT_MANIFEST_HASH_MISMATCH")
        seen.add((manifest.source.tokenizer_sha256, manifest.source.chat_template_sha256))
    if len(seen) != 1:
        raise FailedPrecondition(f"stages were built from different tokenizers or templates: "
                                 f"{sorted(seen)}", reason="TEXT_IDENTITY_MISMATCH")
    tokenizer_sha256, template_sha256 = seen.pop()
    return TextPins(tokenizer_sha256=tokenizer_sha256, template_sha256=template_sha256)

