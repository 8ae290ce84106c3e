"""Keeps the serving engine's view of its route true: degrade on a lost stage, recover after.

On a degraded verdict the engine refuses new requests with 503 ROUTE_UNAVAILABLE and the
route's data plane is closed, so every batch still waiting on a stopped or dead stage fails
at once instead of at its deadline. When every stage answers again under the same plan
generation (a stopped stage resumed, a link came back), the data plane is reopened and the
engine admits again.
"""

from __future__ import annotations

import structlog

from services.orchestrator.route_health import HealthPolicy, RouteHealthMonitor, RouteVerdict
from services.orchestrator.serving import ServingEngine
from services.orchestrator.stage_chain import Route

_log = structlog.get_logger()


class RouteSupervisor:
    def __init__(self, engine: ServingEngine, route: Route,
                 policy: HealthPolicy = HealthPolicy()) -> None:
        self._engine = engine
        self._route = route
        self.monitor = RouteHealthMonitor(route.probe, len(route.plan.stages), self._on_change,
                                          policy)

    def start(self) -> None:
        self._engine.on_route_failure = self.monitor.report_failure
        self._engine.on_close = self.monitor.stop
        self.monitor.start()

    @property
    def stage_conditions(self) -> tuple[str, ...]:
        """Per stage: empty when ready, else what is wrong with it."""
        return tuple("" if c.value == "ready" else c.value
                     for c in self.monitor.tracker.verdict.conditions)

    async def _on_change(self, verdict: RouteVerdict) -> None:
        if verdict.degraded:
            self._engine.degrade(verdict.reason)
            await self._route.abort()
            return
        try:
            await self._route.open()
        except Exception as exc:  # still unusable: stay degraded and keep probing
            reason = f"stage 0 data plane did not reopen ({type(exc).__name__})"
            self.monitor.tracker.force(reason)
            self._engine.degrade(reason)
            return
        self._engine.recover()
