"""Serve the OpenAI app on 127.0.0.1:0 over an in-process pipeline of the tiny model."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.text.context import TextContext
from services.orchestrator.api.http_api import HttpConfig, build_http_app, start_http
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig

MODEL_ID = "fornax-tiny"


def tiny_checkpoint(root: Path) -> Path:
    if not (root / "config.json").exists():
        write_checkpoint(CheckpointRequest("tiny", root))
    return root


@dataclass
class Served:
    base_url: str
    engine: ServingEngine | None
    pipeline: InProcessPipeline | None
    route: RouteSlot


@contextlib.asynccontextmanager
async def serve(checkpoint: Path, *, stages: int = 2, config: ServingConfig = ServingConfig(),
                http: HttpConfig = HttpConfig(), install: bool = True) -> AsyncIterator[Served]:
    route = RouteSlot()
    engine = pipeline = None
    if install:
        pipeline = InProcessPipeline.from_checkpoint(
            InProcessRouteConfig(checkpoint, stages, model_id=MODEL_ID))
        engine = ServingEngine(pipeline, pipeline.served, TextContext.from_checkpoint(checkpoint),
                               config)
        route.engine = engine
    runner, port = await start_http(build_http_app(route, http), "127.0.0.1", 0)
    try:
        yield Served(f"http://127.0.0.1:{port}/v1", engine, pipeline, route)
    finally:
        await runner.cleanup()
        if engine is not None:
            await engine.close()
