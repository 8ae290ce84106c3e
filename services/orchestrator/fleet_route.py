"""Installs a route on the fleet's stage workers and wraps it as a serving engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from libs.common.kinds import DType
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
from services.orchestrator.remote_files import check_text_pins, fetch_manifest
from services.orchestrator.route_pipeline import RoutePipeline
from services.orchestrator.serving import ServingConfig, ServingEngine


def fleet_installer(fleet: Fleet, state_dir: str, model_id: str, kv_limit_bytes: int,
                    serving: ServingConfig, progress: Callable[[str], None],
                    hop_dtypes: tuple[DType, ...] = ()) -> Installer:
    async def installer(request: InstallRequest) -> InstalledRoute:
        spec = InstallSpec(request.checkpoint_dir, request.stages, request.backend,
                           request.boundary_dtype, Path(state_dir), kv_limit_bytes=kv_limit_bytes,
                           hop_dtypes=hop_dtypes)
        installed, route = await install(spec, fleet, progress)
        try:
            # Tokenize with exactly what the artifacts were built from, or refuse to serve.
            manifests = await asyncio.gather(*(fetch_manifest(fleet.artifact_builder, s.manifest_hash, fleet.channel)
                                               for s in route.plan.stages))
            check_text_pins(list(manifests), installed.text_pins)
            text = TextContext.from_checkpoint(installed.model_dir, installed.text_pins)
            # Admission counts against each stage's own KV limit, so an overflow is refused
            # here at once rather than by a stage at prefill.
            limits = tuple(h.kv_bytes_limit for h in await route.health())
            served = served_model(load_config(installed.model_dir),
                                  list(installed.layer_ranges), model_id,
                                  stage_kv_budgets=limits if all(limits) else None)
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
