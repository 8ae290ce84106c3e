"""What a route and its serving engine tell each other: typed events on one bus per route.

The route side (`route/route_supervisor.py`) watches the stages and publishes what it learns:
`RouteLost`, `RouteRecovered`, `NewPipeline` (the stages were reloaded under a new generation)
and `CalibrationObserved`. The engine consumes those and publishes what only it sees:
`BatchLostRoute` (a microbatch failed because the route did), `EngineClosing`,
`RequestsSuspended` (streams wait for replay) and `EngineServing` (it serves again), which the
supervisor and a replica set (`multiroute.py`) consume. Nobody assigns another object's
callbacks: each side subscribes to the events it handles.

`publish` awaits every handler in subscription order, so an engine that reports a lost route
has the route's verdict applied before it goes on; `notify` is for the engine's synchronous
scheduling pass and takes synchronous handlers only.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from services.orchestrator.engine.drift import RouteCalibration
from services.orchestrator.engine.pipeline import Pipeline


@dataclass(frozen=True)
class RouteLost:
    """A stage is down: the engine refuses new requests and suspends or ends what is live."""

    reason: str


@dataclass(frozen=True)
class RouteRecovered:
    """Every stage answers again under the same generation: the same pipeline serves."""


@dataclass(frozen=True)
class NewPipeline:
    """The stages were reloaded under a new generation: serve and replay on this pipeline."""

    pipeline: Pipeline


@dataclass(frozen=True)
class CalibrationObserved:
    """The route's measured service against its plan's predictions, after a probe round."""

    calibration: RouteCalibration


@dataclass(frozen=True)
class BatchLostRoute:
    """A microbatch failed because the route, not a sequence, failed."""

    reason: str


@dataclass(frozen=True)
class EngineClosing:
    """The engine is closing: whatever watches its route stops before the pipeline closes."""


@dataclass(frozen=True)
class RequestsSuspended:
    """A scheduling pass left requests suspended for replay on the bus's engine."""

    count: int


@dataclass(frozen=True)
class EngineServing:
    """The bus's engine serves again (after a degraded spell)."""


E = TypeVar("E")
Handler = Callable[[E], Awaitable[None] | None]


class RouteEvents:
    def __init__(self) -> None:
        self._handlers: dict[type, list[Callable[[Any], Awaitable[None] | None]]] = defaultdict(list)

    def subscribe(self, kind: type[E], handler: Handler[E]) -> None:
        self._handlers[kind].append(handler)

    def unsubscribe(self, kind: type[E], handler: Handler[E]) -> None:
        """Stops delivering `kind` to `handler` (a no-op when it was not subscribed)."""
        handlers = self._handlers.get(kind, [])
        if handler in handlers:
            handlers.remove(handler)

    def subscribed(self, kind: type) -> bool:
        return bool(self._handlers.get(kind))

    async def publish(self, event: object) -> None:
        for handler in tuple(self._handlers.get(type(event), ())):
            outcome = handler(event)
            if inspect.isawaitable(outcome):
                await outcome

    def notify(self, event: object) -> None:
        """Synchronous delivery; a handler that returns an awaitable is a programming error."""
        for handler in tuple(self._handlers.get(type(event), ())):
            outcome = handler(event)
            if inspect.isawaitable(outcome):
                if inspect.iscoroutine(outcome):
                    outcome.close()
                raise TypeError(f"{type(event).__name__} is delivered synchronously; "
                                f"its handler {handler!r} must not be a coroutine")
