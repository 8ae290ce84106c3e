"""Where the front ends find the engine of the installed route (one route's, or a replica set's)."""

from __future__ import annotations

from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.serving import ServingEngine


class RouteSlot:
    """The engine of the currently installed route, or None before one is installed."""

    def __init__(self, engine: ServingEngine | MultiRouteEngine | None = None) -> None:
        self.engine = engine
