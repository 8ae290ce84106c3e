"""OrchestratorService servicer: convert, call the serving core, convert back.

`make_spec` also serves the OpenAI-compatible HTTP API on `http_port`, sharing one RouteSlot
with the gRPC Generate/Cancel handlers.
"""

from __future__ import annotations

from pathlib import Path

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc

from libs.service.errors import Unavailable, Unimplemented
from libs.service.server import ServiceSpec
from libs.text.context import TextContext
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.convert import generation_from_pb, output_to_pb
from services.orchestrator.domain import SchedulerConfig
from services.orchestrator.http_api import HttpConfig, build_http_app, start_http
from services.orchestrator.serving import RouteSlot, ServingConfig, ServingEngine, terminal_error


class OrchestratorServicer(pb_grpc.OrchestratorServiceServicer):
    def __init__(self, cfg: OrchestratorConfig, route: RouteSlot):
        self._cfg = cfg
        self._route = route

    def _engine(self) -> ServingEngine:
        if self._route.engine is None:
            raise Unavailable("no route is installed yet", reason="ROUTE_NOT_READY")
        return self._route.engine

    async def Generate(self, request, context):
        engine = self._engine()
        stream = engine.submit(generation_from_pb(request, engine))
        try:
            async for output in stream:
                error = terminal_error(output) if output.finished else None
                if error is not None:
                    raise error
                yield output_to_pb(output)
        finally:
            if not stream.finished:
                stream.cancel()  # the caller went away or cancelled the RPC

    async def Cancel(self, request, context) -> pb.CancelResponse:
        engine = self._route.engine
        found = engine is not None and engine.cancel(request.target_request_id)
        return pb.CancelResponse(found=found)

    async def InstallPlan(self, request, context) -> pb.InstallPlanResponse:
        raise Unimplemented("InstallPlan is not available in this build")

    async def DrainPlan(self, request, context) -> pb.DrainPlanResponse:
        raise Unimplemented("DrainPlan is not available in this build")

    async def RollbackPlan(self, request, context) -> pb.RollbackPlanResponse:
        raise Unimplemented("RollbackPlan is not available in this build")

    async def GetPlanStatus(self, request, context) -> pb.GetPlanStatusResponse:
        state = pb.ROUTE_STATE_EMPTY if self._route.engine is None else pb.ROUTE_STATE_SERVING
        return pb.GetPlanStatusResponse(current=pb.PlanStatus(state=state))


def serving_config(cfg: OrchestratorConfig) -> ServingConfig:
    return ServingConfig(scheduler=SchedulerConfig(output_queue_capacity=cfg.output_queue_capacity),
                         max_live_requests=cfg.max_live_requests,
                         default_max_tokens=cfg.default_max_tokens)


def inprocess_engine(cfg: OrchestratorConfig) -> ServingEngine:
    from services.orchestrator.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig

    checkpoint = Path(cfg.inprocess_checkpoint or "")
    pipeline = InProcessPipeline.from_checkpoint(InProcessRouteConfig(
        checkpoint, cfg.inprocess_stages, cfg.inprocess_backend, model_id=cfg.model_id))
    return ServingEngine(pipeline, pipeline.served, TextContext.from_checkpoint(checkpoint),
                         serving_config(cfg))


async def make_spec(cfg: OrchestratorConfig) -> ServiceSpec:
    route = RouteSlot(inprocess_engine(cfg) if cfg.inprocess_checkpoint else None)
    servicer = OrchestratorServicer(cfg, route)
    runner, http_port = await start_http(build_http_app(route, HttpConfig(api_key=cfg.api_key)),
                                         cfg.server.host, cfg.http_port)

    async def on_drain() -> None:
        if route.engine is not None:
            route.engine.stop_admitting("draining for shutdown")
            await route.engine.wait_idle()

    async def on_stop() -> None:
        await runner.cleanup()
        if route.engine is not None:
            await route.engine.close()

    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["OrchestratorService"].full_name,),
        register=lambda server: pb_grpc.add_OrchestratorServiceServicer_to_server(servicer, server),
        on_drain=on_drain, on_stop=on_stop, extra_ports={"http": http_port},
    )
