"""Keeps the serving engine's view of its route true: degrade on a lost stage, recover after.

On a degraded verdict the engine refuses new requests with 503 ROUTE_UNAVAILABLE and the
route's data plane is closed, so every batch still waiting on a stopped or dead stage fails
at once instead of at its deadline. Recovery takes one of two paths:
- every stage answers again under the same plan generation and nothing waits for replay (a
  stopped stage resumed): the data plane is reopened;
- a stage came back without the route's stage (its worker was restarted), or requests wait
  for replay: the stored plan is reloaded on every stage as a new generation (the replay
  epoch), and the engine replays each suspended request on it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog

from services.orchestrator.engine import metrics
from services.orchestrator.engine.drift import Calibration, DriftTracker, RouteCalibration
from services.orchestrator.engine.pipeline import Pipeline
from services.orchestrator.engine.route_events import (
    BatchLostRoute,
    CalibrationObserved,
    EngineClosing,
    NewPipeline,
    RouteLost,
    RouteRecovered,
)
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.route_health import (
    HealthPolicy,
    RouteHealthMonitor,
    RouteVerdict,
    StageCondition,
    StageProbe,
)
from services.orchestrator.route.stage_chain import Route

_log = structlog.get_logger()
# Reloads the stored plan on every stage as a new generation; returns the warmed route.
Reloader = Callable[[], Awaitable[Route]]
RELOAD_RETRY_S = 2.0


class RouteSupervisor:
    def __init__(self, engine: ServingEngine, route: Route, policy: HealthPolicy = HealthPolicy(),
                 reload: Reloader | None = None,
                 make_pipeline: Callable[[Route], Pipeline] | None = None,
                 on_reloaded: Callable[[Route], None] | None = None,
                 drift: Callable[[], DriftTracker] | None = None) -> None:
        self._engine = engine
        self._route = route
        self._reload = reload
        self._make_pipeline = make_pipeline
        self._on_reloaded = on_reloaded
        self._last_reload_attempt = 0.0
        # Makes a fresh tracker of the plan's predictions: at install and after each reload.
        self._new_drift = drift
        self.drift = drift() if drift is not None else None
        self.monitor = RouteHealthMonitor(self._probe, len(route.plan.stages),
                                          self._on_change, policy, self._on_degraded_round,
                                          progress=lambda: self._route.meter.take())

    def start(self) -> None:
        events = self._engine.events
        events.subscribe(BatchLostRoute, lambda e: self.monitor.report_failure(e.reason))
        events.subscribe(EngineClosing, lambda e: self._stop())
        if self.drift is not None:
            events.notify(CalibrationObserved(self.drift.calibration))
        self.monitor.start()

    async def _probe(self) -> list[StageProbe]:
        """Each round of health probes also carries each stage's measured service time."""
        probes = await self._route.probe()
        if self.drift is not None:
            calibration = self.drift.observe([p.service for p in probes])
            publish_calibration(calibration)
            await self._engine.events.publish(CalibrationObserved(calibration))
        return probes

    async def _stop(self) -> None:
        await self.monitor.stop()

    @property
    def stage_conditions(self) -> tuple[str, ...]:
        """Per stage: empty when ready, else what is wrong with it."""
        return tuple("" if c is StageCondition.READY else c.value
                     for c in self.monitor.tracker.verdict.conditions)

    async def _on_change(self, verdict: RouteVerdict) -> None:
        if verdict.degraded:
            await self._engine.events.publish(RouteLost(verdict.reason))
            await self._route.abort()
            await self._on_degraded_round(verdict)
            return
        if self._engine.scheduler.suspended_requests and self._can_reload():
            await self._reload_route(verdict)
            return
        try:
            await self._route.open()
        except Exception as exc:  # still unusable: stay degraded and keep probing
            reason = f"stage 0 data plane did not reopen ({type(exc).__name__})"
            self.monitor.tracker.force(reason)
            await self._engine.events.publish(RouteLost(reason))
            return
        await self._engine.events.publish(RouteRecovered())

    async def _on_degraded_round(self, verdict: RouteVerdict) -> None:
        """A restarted worker is reachable but has no stage: reload the whole route."""
        reachable = all(c in (StageCondition.READY, StageCondition.NOT_LOADED)
                        for c in verdict.conditions)
        if (reachable and StageCondition.NOT_LOADED in verdict.conditions and self._can_reload()
                and time.monotonic() - self._last_reload_attempt >= RELOAD_RETRY_S):
            await self._reload_route(verdict)

    def _can_reload(self) -> bool:
        return self._reload is not None and self._engine.scheduler.replay

    async def _reload_route(self, verdict: RouteVerdict) -> None:
        if self._reload is None or self._make_pipeline is None:
            return  # this route was installed without a way to reload it
        self._last_reload_attempt = time.monotonic()
        _log.info("route_reloading", reason=verdict.reason,
                  suspended=self._engine.scheduler.suspended_requests)
        try:
            route = await self._reload()
        except Exception as exc:  # try again on a later probe round
            _log.warning("route_reload_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            self.monitor.tracker.force(verdict.reason or "the route is being reloaded")
            return
        old, self._route = self._route, route
        await old.close()
        self.monitor.reset()
        if self._new_drift is not None:
            self.drift = self._new_drift()
            await self._engine.events.publish(CalibrationObserved(self.drift.calibration))
        if self._on_reloaded is not None:
            self._on_reloaded(route)
        await self._engine.events.publish(NewPipeline(self._make_pipeline(route)))


def publish_calibration(calibration: RouteCalibration) -> None:
    """The calibration as Prometheus gauges: route and per-stage flags, predicted and measured seconds."""
    metrics.ROUTE_UNCALIBRATED.set(1 if calibration.state is Calibration.UNCALIBRATED else 0)
    for stage in calibration.stages:
        label = str(stage.index)
        metrics.STAGE_UNCALIBRATED.labels(label).set(1 if stage.state is Calibration.UNCALIBRATED else 0)
        if stage.predicted_s is not None:
            metrics.STAGE_DECODE_SERVICE.labels(label, "predicted").set(stage.predicted_s)
        if stage.measured is not None and stage.measured.recent_microbatches:
            metrics.STAGE_DECODE_SERVICE.labels(label, "measured").set(stage.measured.recent_decode_service_s)
