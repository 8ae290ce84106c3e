"""OrchestratorService servicer: convert, call the serving core, convert back.

`make_spec` also serves the OpenAI-compatible HTTP API on `http_port`; HTTP and gRPC share
one RouteSlot, which the RouteManager fills once a route is installed and warmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import structlog

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from libs.common.kinds import DType
from libs.security.fnx2_tls import Fnx2Tls
from libs.security.tls import own_identity_uri
from libs.service.errors import FailedPrecondition, FornaxError, InvalidArgument, Unavailable, describe_failure
from libs.service.server import ServiceSpec
from services.orchestrator import convert
from services.orchestrator.api.http_api import (
    BOARD_KEY,
    TOKENIZE_INLINE_MAX_BYTES,
    build_http_app,
    start_http,
)
from services.orchestrator.api.http_tls import choose_http_tls, is_loopback, server_ssl_context
from services.orchestrator.coldstart_setup import chooser, compiler_factory, unload_reference
from services.orchestrator.config import OrchestratorConfig, serving_config
from services.orchestrator.engine.drift import DriftPolicy
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingEngine, build_engine, terminal_error
from services.orchestrator.replan_setup import pool_watcher
from services.orchestrator.resume_setup import resume_at_startup, resumed_installer
from services.orchestrator.route.added_routes import add_routes
from services.orchestrator.route.coldstart import BackendBoard, serve_then_upgrade
from services.orchestrator.route.host_drain import drain_host
from services.orchestrator.route.lifecycle import (
    InstalledRoute,
    Installer,
    InstallRequest,
    Preparer,
    RouteManager,
)
from services.orchestrator.route.queued_tokens import publish_queued_tokens
from services.orchestrator.route.rejoin_watch import RejoinWatcher
from services.orchestrator.route.route_set_store import RouteSetJournal, journaled

if TYPE_CHECKING:
    from services.orchestrator.route.install import WeightsChoice

_log = structlog.get_logger()


class OrchestratorServicer(pb_grpc.OrchestratorServiceServicer):
    def __init__(self, cfg: OrchestratorConfig, route: RouteSlot, manager: RouteManager,
                 journal: RouteSetJournal | None = None):
        self._cfg = cfg
        self._route = route
        self._manager = manager
        # Marks each change of the serving set in flight, and commits the set it leaves.
        self._journal = journal or RouteSetJournal(cfg.route.state_dir, cfg.route.stage_workers)

    def _engine(self) -> ServingEngine | MultiRouteEngine:
        if self._route.engine is None:
            raise Unavailable("no route is installed yet", reason="ROUTE_NOT_READY")
        return self._route.engine

    async def Generate(self, request, context):
        engine = self._engine()
        if len(request.text) > TOKENIZE_INLINE_MAX_BYTES:  # keep the loop free for streams
            generation = await asyncio.to_thread(convert.generation_from_pb, request, engine)
        else:
            generation = convert.generation_from_pb(request, engine)
        # Leaving the block early (the caller went away or cancelled the RPC) cancels the request.
        async with engine.submit(generation) as stream:
            async for output in stream:
                error = terminal_error(output) if output.finished else None
                if error is not None:
                    raise error
                yield convert.output_to_pb(output)

    async def Cancel(self, request, context) -> pb.CancelResponse:
        engine = self._route.engine
        found = engine is not None and engine.cancel(request.target_request_id)
        return pb.CancelResponse(found=found)

    async def InstallPlan(self, request, context) -> pb.InstallPlanResponse:
        status = await self._manager.install(convert.install_request_from_pb(request))
        return pb.InstallPlanResponse(status=convert.status_to_pb(status))

    async def DrainPlan(self, request, context) -> pb.DrainPlanResponse:
        timeout_s = request.timeout_ns / 1e9 if request.timeout_ns else None
        status = await self._manager.drain(timeout_s)
        return pb.DrainPlanResponse(status=convert.status_to_pb(status))

    async def RollbackPlan(self, request, context) -> pb.RollbackPlanResponse:
        status = await self._manager.rollback()
        return pb.RollbackPlanResponse(status=convert.status_to_pb(status))

    async def GetPlanStatus(self, request, context) -> pb.GetPlanStatusResponse:
        return pb.GetPlanStatusResponse(current=convert.status_to_pb(self._manager.status()))

    async def DrainHost(self, request, context) -> pb.DrainHostResponse:
        if not request.worker_address:
            raise InvalidArgument("name the leaving host's stage worker", reason="MISSING_WORKER",
                                  field="worker_address")
        timeout_s = request.timeout_ns / 1e9 if request.timeout_ns else self._cfg.route.drain_timeout_s
        outcome = await self._manager.change_routes("drain a host", journaled(self._journal, "drain a host", partial(
            drain_host, worker=request.worker_address, timeout_s=timeout_s, store=self._journal)))
        return convert.host_drain_to_pb(outcome, self._manager.status())

    async def AddRoutes(self, request, context) -> pb.AddRoutesResponse:
        if not (self._cfg.route.planner_addr and self._cfg.route.artifact_builder_addr):
            raise FailedPrecondition("no planner or artifact builder configured", reason="NO_FLEET")
        added = [tuple(route.worker_addresses) for route in request.routes]
        await self._manager.change_routes("add routes", journaled(self._journal, "add routes", partial(
            add_routes, added=added, member=self._member_installer, store=self._journal)))
        return pb.AddRoutesResponse(status=convert.status_to_pb(self._manager.status()))

    def _member_installer(self, workers: tuple[str, ...]) -> Installer:
        """A replica route on workers that joined: one boundary dtype on every hop, the fleet's weights."""
        hops = self._cfg.route.hop_boundary_dtypes[:1] * (len(workers) - 1)
        return fleet_route_installer(self._cfg, workers, hops, weights_choice(self._cfg, ()))


def inprocess_installer(cfg: OrchestratorConfig) -> Installer:
    """Stages as threads of this process: development and tests, never a fallback."""

    async def installer(request: InstallRequest) -> InstalledRoute:
        from pathlib import Path

        from libs.text.context import TextContext
        from services.orchestrator.route.inprocess_pipeline import (
            InProcessPipeline,
            InProcessRouteConfig,
        )
        from services.orchestrator.route.lifecycle import PlanIdentity

        if request.backend is None:
            raise InvalidArgument("in-process stages need a backend; there are no workers to choose theirs",
                                  field="backend")
        pipeline = InProcessPipeline.from_checkpoint(InProcessRouteConfig(
            Path(request.checkpoint_dir), request.stages, request.backend, model_id=cfg.route.model_id))
        engine = build_engine(serving_config(cfg), pipeline,
                              TextContext.from_checkpoint(request.checkpoint_dir))
        return InstalledRoute(request, PlanIdentity("in-process", "", pipeline.generation), (),
                              engine)

    return installer


def choose_installer(cfg: OrchestratorConfig, resumed: tuple[tuple[str, ...], ...] = ()) -> Installer:
    """`resumed`: the stored routes an orchestrator that restarted serves (resume_setup.py)."""
    if cfg.inprocess.checkpoint:
        return inprocess_installer(cfg)
    planner, builder = cfg.route.planner_addr, cfg.route.artifact_builder_addr
    if cfg.route.stage_workers and planner and builder:
        on = partial(fleet_route_installer, cfg)
        if resumed:
            return resumed_installer(cfg, resumed, on)
        if cfg.route.route_groups:
            return _replica_installer(cfg, on)
        if cfg.route.reference_stage_workers:
            from services.orchestrator.coldstart_setup import by_backend

            return by_backend(on(cfg.route.stage_workers), on(cfg.route.reference_stage_workers))
        return on(cfg.route.stage_workers)

    async def no_fleet(request: InstallRequest) -> InstalledRoute:
        raise FailedPrecondition("no stage workers, planner or artifact builder configured",
                                 reason="NO_FLEET")

    return no_fleet


def fleet_route_installer(cfg: OrchestratorConfig, workers: tuple[str, ...],
                          hop_dtypes: tuple[DType, ...] | None = None,
                          weights: WeightsChoice | None = None) -> Installer:
    """Installs a route on `workers` (stage order) through the fleet's planner and builder."""
    from services.orchestrator.route.fleet_route import fleet_installer
    from services.orchestrator.route.install import Fleet

    route = cfg.route
    fleet = Fleet(route.planner_addr or "", route.artifact_builder_addr or "", workers, cfg.server.client_channel(),
                  own_identity_uri(cfg.server.tls), Fnx2Tls(cfg.server.tls) if cfg.server.tls else None,
                  route.registry_addr or "", route.plan_mode)
    return fleet_installer(fleet, route.state_dir, route.model_id, route.stage_kv_limit_bytes, serving_config(cfg),
                           lambda message: _log.info("install_progress", message=message),
                           hop_dtypes=route.hop_boundary_dtypes if hop_dtypes is None else hop_dtypes,
                           drift=drift_policy(cfg), weights=weights or weights_choice(cfg))


def _replica_installer(cfg: OrchestratorConfig, on: Callable[..., Installer]) -> Installer:
    """One route per FORNAX_ROUTE_GROUPS group, on that group's stage workers, its hops and weights."""
    from services.orchestrator.route.install import WeightsChoice
    from services.orchestrator.route.replica_routes import check_route_groups, replica_installer

    route = cfg.route
    check_route_groups(route.route_groups, len(route.stage_workers))
    if route.reference_stage_workers:
        raise InvalidArgument("replica routes do not serve on reference workers while graphs compile",
                              reason="ROUTE_GROUPS_WITH_REFERENCE", field="FORNAX_ROUTE_GROUPS")
    if len(set(route.hop_boundary_dtypes)) > 1:
        raise InvalidArgument("replica routes need one boundary dtype on every hop",
                              reason="ROUTE_GROUPS_MIXED_HOPS", field="FORNAX_HOP_BOUNDARY_DTYPES")

    def member(group: tuple[int, ...]) -> Installer:
        hops = route.hop_boundary_dtypes[:1] * (len(group) - 1)
        weights = WeightsChoice(route.weights_policy, tuple(route.worker_weights[i] for i in group)
                                if route.worker_weights else ())
        return on(tuple(route.stage_workers[i] for i in group), hops, weights)

    return replica_installer(route.route_groups, member)


def weights_choice(cfg: OrchestratorConfig, worker_weights: tuple[str, ...] | None = None) -> WeightsChoice:
    """The configured weights; `worker_weights` () for workers the configuration does not list."""
    from services.orchestrator.route.install import WeightsChoice

    return WeightsChoice(cfg.route.weights_policy,
                         cfg.route.worker_weights if worker_weights is None else worker_weights)


def drift_policy(cfg: OrchestratorConfig) -> DriftPolicy:
    return cfg.drift.policy()


def choose_preparer(cfg: OrchestratorConfig, resumed: bool = False) -> Preparer | None:
    """Fleet installs plan and build while the current route still serves."""
    planner, builder = cfg.route.planner_addr, cfg.route.artifact_builder_addr
    if cfg.inprocess.checkpoint or not (cfg.route.stage_workers and planner and builder):
        return None
    if cfg.route.route_groups or resumed:  # each replica route plans on its own workers as it installs
        return None
    from services.orchestrator.route.fleet_route import fleet_preparer
    from services.orchestrator.route.install import Fleet

    def on(workers: tuple[str, ...]) -> Preparer:
        fleet = Fleet(planner, builder, workers, cfg.server.client_channel(),
                      own_identity_uri(cfg.server.tls), Fnx2Tls(cfg.server.tls) if cfg.server.tls else None,
                          cfg.route.registry_addr or "", cfg.route.plan_mode)
        return fleet_preparer(fleet, cfg.route.state_dir, cfg.route.stage_kv_limit_bytes,
                              lambda message: _log.info("install_progress", message=message),
                              hop_dtypes=cfg.route.hop_boundary_dtypes, weights=weights_choice(cfg))

    if cfg.route.reference_stage_workers:  # each backend plans on the workers that will run it
        from services.orchestrator.coldstart_setup import by_backend

        return by_backend(on(cfg.route.stage_workers), on(cfg.route.reference_stage_workers))
    return on(cfg.route.stage_workers)


async def _install_at_startup(manager: RouteManager, request: InstallRequest, board: BackendBoard,
                              cfg: OrchestratorConfig) -> None:
    try:
        await serve_then_upgrade(manager, request, board, compiler_factory(cfg), unload_reference(cfg),
                                 chooser(cfg))
        status = manager.status()
        _log.info("route_installed", plan_id=status.plan.plan_id if status.plan else "",
                  stages=request.stages, backend=board.running_backend, phase=board.phase.value)
    except FornaxError as exc:
        _log.error("route_install_failed", reason=exc.reason, error=exc.message)
    except Exception as exc:
        _log.exception("route_install_failed", error=describe_failure(exc))


def _start_scale_out(cfg: OrchestratorConfig, manager: RouteManager, store: RouteSetJournal) -> Callable[[], None]:
    """Exports each route's queued tokens, with --replan-on-change watches the pools, and with
    --rejoin-timeout-s removes a replica route whose host stays gone; returns what stops them."""
    stop_metric = publish_queued_tokens(lambda: manager.current)
    loop = asyncio.get_running_loop()
    watcher = pool_watcher(cfg, manager, lambda moved: (choose_installer(moved), choose_preparer(moved)))
    watching = [loop.create_task(watcher.run())] if watcher else []
    if cfg.route.rejoin_timeout_s > 0:
        watching.append(loop.create_task(RejoinWatcher(manager, cfg.route.rejoin_timeout_s, store).run()))

    def stop() -> None:
        stop_metric()
        for task in watching:
            task.cancel()

    return stop


async def make_spec(cfg: OrchestratorConfig) -> ServiceSpec:
    route = RouteSlot()
    resume, journal = resume_at_startup(cfg)  # an orchestrator that restarts serves the set it stored
    manager = RouteManager(route, choose_installer(cfg, resume.routes), cfg.route.drain_timeout_s,
                           choose_preparer(cfg, bool(resume.routes)), resume.removed)
    stop_scale_out = _start_scale_out(cfg, manager, journal)
    startup: asyncio.Task | None = None
    board = BackendBoard(cfg.inprocess.backend if cfg.inprocess.checkpoint else cfg.route.backend)
    if cfg.inprocess.checkpoint:
        await serve_then_upgrade(manager, InstallRequest(cfg.inprocess.checkpoint, cfg.inprocess.stages,
                                                         cfg.inprocess.backend, DType.FP32), board, None)
    elif cfg.route.checkpoint:
        # Planning, building and loading take a while: serve (not ready) meanwhile.
        startup = asyncio.get_running_loop().create_task(_install_at_startup(
            manager, InstallRequest(cfg.route.checkpoint, sum(map(len, resume.routes)) or len(cfg.route.stage_workers),
                                    cfg.route.backend, cfg.route.boundary_dtype), board, cfg))
    servicer = OrchestratorServicer(cfg, route, manager, journal)
    http_tls = choose_http_tls(cfg.server.host, cfg.http.tls, cfg.server.tls, cfg.http.insecure)
    if http_tls is None and not is_loopback(cfg.server.host):
        _log.warning("http_plaintext_beyond_loopback", host=cfg.server.host)
    app = build_http_app(route, cfg.http.http_config(cfg.serving.idle_write_timeout_s))
    app[BOARD_KEY] = board
    runner, http_port = await start_http(app, cfg.server.host, cfg.http.port,
                                         server_ssl_context(http_tls) if http_tls else None)
    _log.info("http_api_serving", port=http_port, scheme="https" if http_tls else "http")

    async def on_drain() -> None:
        try:
            await manager.drain()
        except FornaxError as exc:  # nothing installed, or an install still running
            _log.info("drain_skipped", reason=exc.reason)

    async def on_stop() -> None:
        stop_scale_out()
        if startup is not None:
            startup.cancel()
        await runner.cleanup()
        await manager.close()

    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["OrchestratorService"].full_name,),
        register=lambda server: pb_grpc.add_OrchestratorServiceServicer_to_server(servicer, server),
        on_drain=on_drain, on_stop=on_stop, extra_ports={"http": http_port}, api_key=cfg.http.api_key,
    )
