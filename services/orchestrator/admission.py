"""Admission: reserve queue space and KV space on every stage before accepting a request.

All-or-nothing and immediate: a request that does not fit is rejected at once with a
capacity error that names the exhausted resource; nothing ever waits for room.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.service.errors import InvalidArgument, ResourceExhausted, Unavailable
from services.orchestrator.domain import StageLayout


@dataclass(frozen=True)
class AdmissionConfig:
    max_live_requests: int
    # Per stage, in stage order: bytes of KV cache this route may fill on that stage.
    stage_kv_budget_bytes: tuple[int, ...]


@dataclass(frozen=True)
class Reservation:
    request_id: str
    tokens: int
    stage_kv_bytes: tuple[int, ...]


@dataclass(frozen=True)
class AdmissionSnapshot:
    live_requests: int
    stage_kv_reserved_bytes: tuple[int, ...]


class AdmissionControl:
    def __init__(self, config: AdmissionConfig, stages: tuple[StageLayout, ...]) -> None:
        if len(config.stage_kv_budget_bytes) != len(stages):
            raise InvalidArgument(
                f"{len(config.stage_kv_budget_bytes)} KV budgets for {len(stages)} stages",
                reason="KV_BUDGET", field="stage_kv_budget_bytes")
        self._config = config
        self._stages = stages
        self._reserved = [0] * len(stages)
        self._live: dict[str, Reservation] = {}
        self._closed_reason: str | None = None

    def close(self, reason: str) -> None:
        """Stops new admissions (drain); reservations already held stay until released."""
        self._closed_reason = reason

    def reserve(self, request_id: str, tokens: int) -> Reservation:
        """Reserves `tokens` (prompt + max_tokens) of KV on every stage, or raises."""
        if self._closed_reason is not None:
            raise Unavailable(f"route is not admitting: {self._closed_reason}",
                              reason="NOT_ADMITTING")
        if request_id in self._live:
            raise InvalidArgument(f"request {request_id} is already admitted",
                                  reason="DUPLICATE_REQUEST", field="request_id")
        if len(self._live) >= self._config.max_live_requests:
            raise ResourceExhausted(
                f"request queue is full ({self._config.max_live_requests} live requests)")
        need = tuple(tokens * stage.kv_bytes_per_token for stage in self._stages)
        for index, (want, used, budget) in enumerate(
                zip(need, self._reserved, self._config.stage_kv_budget_bytes)):
            if used + want > budget:
                raise ResourceExhausted(
                    f"KV space on stage {index} exhausted: request needs {want} bytes "
                    f"({tokens} tokens), {budget - used} of {budget} bytes free")
        for index, want in enumerate(need):
            self._reserved[index] += want
        reservation = Reservation(request_id=request_id, tokens=tokens, stage_kv_bytes=need)
        self._live[request_id] = reservation
        return reservation

    def release(self, request_id: str) -> None:
        reservation = self._live.pop(request_id, None)
        if reservation is None:
            return
        for index, held in enumerate(reservation.stage_kv_bytes):
            self._reserved[index] -= held

    @property
    def closed_reason(self) -> str | None:
        return self._closed_reason

    def holds(self, request_id: str) -> bool:
        return request_id in self._live

    def snapshot(self) -> AdmissionSnapshot:
        return AdmissionSnapshot(live_requests=len(self._live),
                                 stage_kv_reserved_bytes=tuple(self._reserved))
