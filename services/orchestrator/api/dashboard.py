"""`/dashboard`: a live view of the installed route, served by the OpenAI HTTP app.

The page (`dashboard.html`) is static, self-contained (no CDN) and holds no data; it polls
`/dashboard/state` once a second. With an API key configured, the state endpoint needs the
same bearer token as `/v1/`; the page takes it from its URL fragment (`#token=...`, never sent
to the server in a URL), keeps it in sessionStorage and removes it from the address bar. The
server never writes the key into any response.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import structlog
from aiohttp import web

from libs.service.log_limit import LogLimiter
from services.orchestrator.api.dashboard_state import DashboardState, Sample
from services.orchestrator.api.openai_response import routes_value
from services.orchestrator.engine import metrics
from services.orchestrator.engine.client import EngineClient
from services.orchestrator.engine.domain import FinishReason
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_slot import RouteSlot

PAGE = Path(__file__).with_name("dashboard.html")
SAMPLE_INTERVAL_S = 1.0
STATE_PATH = "/dashboard/state"
_ERROR_FINISHES = tuple(r.value for r in FinishReason
                        if r not in (FinishReason.STOP, FinishReason.LENGTH))
_log = structlog.get_logger()

DASHBOARD_KEY = web.AppKey("dashboard", DashboardState)


def add_dashboard(app: web.Application, route: RouteSlot) -> None:
    app[DASHBOARD_KEY] = DashboardState()

    async def state(request: web.Request) -> web.Response:
        engine: EngineClient | None = route.engine
        calibration = None if engine is None else engine.route_calibration()
        snapshot = request.app[DASHBOARD_KEY].snapshot(
            None if engine is None else engine.served, time.monotonic(), calibration)
        snapshot["routes"] = routes_value(engine.routes()) if isinstance(engine, MultiRouteEngine) else []
        return web.json_response(snapshot, headers={"Cache-Control": "no-store"})

    app.router.add_get("/dashboard", _page)
    app.router.add_get(STATE_PATH, state)
    # Browsers ask for one; answering keeps a 404 out of the dashboard's error counts.
    app.router.add_get("/favicon.ico", _no_icon)
    app.cleanup_ctx.append(_sampling(route))


def record_error(app: web.Application, reason: str) -> None:
    state = app.get(DASHBOARD_KEY)
    if state is not None:
        state.error(time.monotonic(), reason)


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)


async def _page(request: web.Request) -> web.Response:
    return web.Response(body=PAGE.read_bytes(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store",
                                 "Content-Security-Policy": "default-src 'self'; "
                                 "script-src 'unsafe-inline'; style-src 'unsafe-inline'"})


def _counter_total(counter, label_filter=None) -> int:
    total = 0
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and (label_filter is None or label_filter(sample.labels)):
                total += int(sample.value)
    return total


def _finished_errors() -> dict[str, int]:
    return {reason: _counter_total(metrics.FINISHED, lambda labels, r=reason: labels.get("finish_reason") == r)
            for reason in _ERROR_FINISHES}


async def take_sample(route: RouteSlot) -> Sample | None:
    engine: EngineClient | None = route.engine
    if engine is None:
        return None
    stats = await engine.stage_stats()
    metrics.publish_stage_blocks(stats)
    return Sample(time.monotonic(), _counter_total(metrics.OUTPUT_TOKENS), engine.snapshot().live_requests,
                  _finished_errors(), tuple(stats))


def _sampling(route: RouteSlot):
    async def context(app: web.Application):
        task = asyncio.create_task(_sample_forever(route, app[DASHBOARD_KEY]))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context


async def _sample_forever(route: RouteSlot, state: DashboardState) -> None:
    limiter = LogLimiter()
    while True:
        try:
            sample = await take_sample(route)
            if sample is not None:
                state.record(sample)
        except grpc.aio.AioRpcError as exc:  # a stage down now may answer the next time
            suppressed = limiter.allow("dashboard_sample_failed")
            if suppressed is not None:  # the route's health already reports which stage
                _log.warning("dashboard_sample_failed", code=exc.code().name,
                             suppressed=suppressed)
        except Exception:
            if limiter.allow("dashboard_sample_error") is not None:
                _log.exception("dashboard_sample_error")
        await asyncio.sleep(SAMPLE_INTERVAL_S)
