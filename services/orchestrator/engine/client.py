"""What the front ends (api/) ask of the engine serving the installed route.

`ServingEngine` satisfies `EngineClient`; the front ends hold it only through this protocol, so
they submit and cancel requests and read a snapshot of the engine's state, and nothing more.
"""

from __future__ import annotations

from typing import Protocol

from libs.text.context import TextContext
from services.orchestrator.engine.domain import EngineSnapshot, GenerationRequest, ServedModel, StageStats
from services.orchestrator.engine.drift import RouteCalibration
from services.orchestrator.engine.request_stream import RequestStream
from services.orchestrator.engine.serving import ServingConfig


class EngineClient(Protocol):
    @property
    def served(self) -> ServedModel: ...

    @property
    def text(self) -> TextContext: ...

    @property
    def config(self) -> ServingConfig: ...

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Admits `request` (or raises its refusal at once); its events arrive on the stream."""
        ...

    def cancel(self, request_id: str) -> bool: ...

    def snapshot(self) -> EngineSnapshot: ...

    def route_calibration(self) -> RouteCalibration | None:
        """The route's calibration against its plan's predictions; None when nothing watches it."""
        ...

    async def stage_stats(self) -> list[StageStats]: ...
