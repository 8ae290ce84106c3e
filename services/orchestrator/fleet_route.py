"""Installs a route on the fleet's stage workers and wraps it as a serving engine."""

from __future__ import annotations

from collections.abc import Callable

from libs.model.config import load_config
from libs.text.context import TextContext
from services.orchestrator.install import Fleet, InstallSpec, install
from services.orchestrator.lifecycle import (
    InstalledRoute,
    Installer,
    InstallRequest,
    PlanIdentity,
    StageInfo,
)
from services.orchestrator.model_card import served_model
from services.orchestrator.route_pipeline import RoutePipeline
from services.orchestrator.serving import ServingConfig, ServingEngine


def fleet_installer(fleet: Fleet, artifact_store: str, model_id: str, kv_limit_bytes: int,
                    serving: ServingConfig, progress: Callable[[str], None]) -> Installer:
    async def installer(request: InstallRequest) -> InstalledRoute:
        spec = InstallSpec(request.checkpoint_dir, request.stages, request.backend,
                           request.boundary_dtype, artifact_store, kv_limit_bytes=kv_limit_bytes)
        installed, route = await install(spec, fleet, progress)
        try:
            text = TextContext.from_checkpoint(request.checkpoint_dir)
            served = served_model(load_config(request.checkpoint_dir),
                                  list(installed.layer_ranges), model_id, kv_limit_bytes or None)
        except BaseException:
            await route.close()
            raise
        plan = route.plan
        stages = tuple(StageInfo(s.index, s.control_address, a, b, s.manifest_hash)
                       for s, (a, b) in zip(plan.stages, installed.layer_ranges))
        engine = ServingEngine(RoutePipeline(route, served), served, text, serving)
        return InstalledRoute(request, PlanIdentity(plan.plan_id, plan.plan_hash,
                                                    plan.plan_generation_id), stages, engine)

    return installer
