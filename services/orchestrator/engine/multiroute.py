"""Several replica routes behind one API: one serving engine per route, one front for them all.

Each route keeps its own `ServingEngine` (scheduler, admission, KV accounting, supervisor).
`MultiRouteEngine` admits each request onto one of them, as `route_choice.choose_route` picks
from their loads, and refuses with 503 ROUTE_UNAVAILABLE only when no route serves. When a
route loses a stage its engine suspends its greedy streams for replay (as a single route
does); every suspended stream that another route can take is handed over at once with its
client's stream: the other route prefills its prompt plus every token it already emitted and
continues, so its reader sees a pause and the same tokens. A stream no route can take waits
for its own route's recovery (or its recovery timeout), as it would on a single route.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from libs.service.errors import FornaxError, InvalidArgument
from libs.text.context import TextContext
from services.orchestrator.engine import metrics
from services.orchestrator.engine.domain import EngineSnapshot, GenerationRequest, ServedModel, StageStats
from services.orchestrator.engine.drift import RouteCalibration
from services.orchestrator.engine.request_stream import RequestStream
from services.orchestrator.engine.route_choice import (
    Stranded,
    choose_route,
    place_stranded,
    unavailable_detail,
)
from services.orchestrator.engine.route_events import EngineServing, RequestsSuspended
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.engine.unavailable import ROUTE_UNAVAILABLE, route_unavailable

_log = structlog.get_logger()


@dataclass(frozen=True)
class ReplicaRouteView:
    """One replica route as the front ends show it (/v1/models, the dashboard)."""

    index: int
    state: str  # serving, degraded or not_admitting
    reason: str  # why it is degraded or not admitting; "" while it serves
    plan_id: str
    stage_layers: tuple[tuple[int, int], ...]  # per stage: [layer_start, layer_end)
    live_requests: int


class MultiRouteEngine:
    def __init__(self, engines: Sequence[ServingEngine]) -> None:
        if len(engines) < 2:
            raise InvalidArgument(f"replica routes need at least 2 engines, got {len(engines)}",
                                  reason="BAD_ROUTE_COUNT", field="routes")
        self.engines = tuple(engines)
        self._subscriptions: list[tuple[ServingEngine, type, Callable[[Any], None]]] = []
        for engine in self.engines:
            self._subscriptions += [(engine, RequestsSuspended, functools.partial(self._on_suspended, engine)),
                                    (engine, EngineServing, self._on_serving)]
        for engine, kind, handler in self._subscriptions:
            engine.events.subscribe(kind, handler)

    def detach(self) -> None:
        """Stops handing streams between these routes: a new set (or a lone route) takes over."""
        for engine, kind, handler in self._subscriptions:
            engine.events.unsubscribe(kind, handler)
        self._subscriptions = []

    # ----- what the front ends ask (EngineClient) -----

    @property
    def served(self) -> ServedModel:
        return self.engines[0].served

    @property
    def text(self) -> TextContext:
        return self.engines[0].text

    @property
    def config(self) -> ServingConfig:
        return self.engines[0].config

    def submit(self, request: GenerationRequest) -> RequestStream:
        needed = len(request.prompt_token_ids) + request.max_tokens
        index = choose_route([e.load(i) for i, e in enumerate(self.engines)], needed)
        if index is None:
            metrics.REJECTED.labels(ROUTE_UNAVAILABLE).inc()
            raise route_unavailable(self._why_down())
        return self.engines[index].submit(request)

    def cancel(self, request_id: str) -> bool:
        return any(engine.cancel(request_id) for engine in self.engines)

    def snapshot(self) -> EngineSnapshot:
        live = self.live_requests
        if any(engine.admitting for engine in self.engines):
            return EngineSnapshot(live, None, None)
        degraded = any(engine.degraded_reason for engine in self.engines)
        closed = next((e.admission.closed_reason for e in self.engines if e.admission.closed_reason), None)
        return EngineSnapshot(live, self._why_down() if degraded else None, closed)

    def route_calibration(self) -> RouteCalibration | None:
        """Per-route calibrations are in each route's own status; the set has none of its own."""
        return None

    async def stage_stats(self) -> list[StageStats]:
        """Every serving route's stages, route after route; a route that cannot answer is left out."""
        answers = await asyncio.gather(*(e.stage_stats() for e in self.engines), return_exceptions=True)
        return [s for answer in answers if not isinstance(answer, BaseException) for s in answer]

    def routes(self) -> tuple[ReplicaRouteView, ...]:
        return tuple(ReplicaRouteView(
            index, "serving" if e.admitting else "degraded" if e.degraded_reason else "not_admitting",
            e.degraded_reason or e.admission.closed_reason or "", e.served.card.plan_id,
            tuple((s.layer_start, s.layer_end) for s in e.served.stages), e.live_requests)
            for index, e in enumerate(self.engines))

    # ----- what the lifecycle asks of an installed route -----

    @property
    def degraded_reason(self) -> str | None:
        """Set only when no route serves and some route is degraded."""
        return self.snapshot().degraded_reason

    @property
    def admitting(self) -> bool:
        """Some route takes new requests."""
        return any(engine.admitting for engine in self.engines)

    @property
    def live_requests(self) -> int:
        return sum(engine.live_requests for engine in self.engines)

    def stop_admitting(self, reason: str) -> None:
        for engine in self.engines:
            engine.stop_admitting(reason)

    async def wait_idle(self) -> None:
        await asyncio.gather(*(engine.wait_idle() for engine in self.engines))

    async def close(self, release_timeout_s: float | None = None) -> None:
        await asyncio.gather(*(engine.close(release_timeout_s) for engine in self.engines))

    # ----- failover -----

    def _why_down(self) -> str:
        return unavailable_detail([e.degraded_reason or e.admission.closed_reason for e in self.engines])

    def _on_suspended(self, source: ServingEngine, event: RequestsSuspended) -> None:
        self._fail_over(source)

    def _on_serving(self, event: EngineServing) -> None:
        self._fail_over_all()

    def _fail_over_all(self) -> None:
        for engine in self.engines:
            if engine.scheduler.suspended_requests:
                self._fail_over(engine)

    def _fail_over(self, source: ServingEngine) -> None:
        """Hands `source`'s suspended streams to the routes that serve, as `place_stranded` places them."""
        suspended = source.suspended()
        if not suspended:
            return
        loads = [e.load(i) for i, e in enumerate(self.engines)]
        origin = self.engines.index(source)
        loads[origin] = replace(loads[origin], serving=False)  # never back onto itself
        placement = place_stranded([Stranded(s.request_id, s.needed_tokens) for s in suspended], loads)
        moved: dict[int, int] = {}
        for request in suspended:
            index = placement.get(request.request_id)
            if index is None:
                continue
            try:
                source.hand_off(request, self.engines[index])
            except FornaxError as exc:  # the target refused it: it stays suspended here
                _log.warning("route_handoff_refused", request_id=request.request_id, source_route=origin,
                             target_route=index, reason=exc.reason)
                continue
            moved[index] = moved.get(index, 0) + 1
        if moved:
            metrics.ROUTE_HANDOFFS.inc(sum(moved.values()))
            _log.info("route_failover", source_route=origin, moved={str(k): v for k, v in moved.items()},
                      waiting=len(suspended) - sum(moved.values()))
