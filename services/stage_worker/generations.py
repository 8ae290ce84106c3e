"""The plan generations one stage worker holds: usually one, two while a new plan is installed.

A reinstall loads the new plan's range beside the serving one (make before break). Each loaded
generation has its own runtime (weights, KV, admissions, lifecycle) and its own FNX2 listener:
an FNX2 receiver names its binding, generation included, in the hello it sends first, so one
listener cannot serve two generations. The first generation takes the worker's configured
data-plane port; a generation loaded beside it takes the overlap port (ephemeral by default).
All generations share the worker's one device thread. Control calls name their generation,
or fall to the one that admitted the request, or to the newest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from libs.service.errors import FailedPrecondition
from services.stage_worker.dataplane import DataPlane
from services.stage_worker.lifecycle import StageState
from services.stage_worker.overlap import MemoryFacts, overlap_refusal
from services.stage_worker.runtime import LoadedStage, LoadSpec, StageRuntime

log = structlog.get_logger()
# The serving generation and the one being installed beside it.
MAX_GENERATIONS = 2


@dataclass
class Slot:
    generation: str
    runtime: StageRuntime
    plane: DataPlane


@dataclass(frozen=True)
class Unloaded:
    generations: tuple[str, ...]
    live_sequences: int  # what they still held when unloaded
    kv_bytes_used: int


class Generations:
    def __init__(self, new_runtime: Callable[[], StageRuntime], primary: DataPlane,
                 new_plane: Callable[[], Awaitable[DataPlane]], memory: Callable[[], MemoryFacts]):
        self._new_runtime = new_runtime
        self._primary = primary
        self._new_plane = new_plane
        self._memory = memory
        self._slots: dict[str, Slot] = {}  # oldest first
        # What health reports while nothing is loaded: the last runtime (unloaded or failed).
        self._last = new_runtime()
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> tuple[str, ...]:
        return tuple(self._slots)

    def newest(self) -> Slot | None:
        return next(reversed(self._slots.values()), None)

    def runtimes(self) -> list[StageRuntime]:
        return [slot.runtime for slot in self._slots.values()]

    def get(self, generation: str) -> Slot:
        """The named generation's slot, or the newest for ""; refuses what is not loaded."""
        slot = self._slots.get(generation) if generation else self.newest()
        if slot is None:
            if generation:
                raise FailedPrecondition(f"plan generation {generation} is not loaded on this worker",
                                         reason="GENERATION_NOT_LOADED", field="plan_generation_id")
            raise FailedPrecondition(f"no stage is loaded (state {self._last.lifecycle.state.value})",
                                     reason="STAGE_NOT_LOADED")
        return slot

    def health_runtime(self, generation: str) -> StageRuntime:
        if not generation and not self._slots:
            return self._last
        return self.get(generation).runtime

    def for_request(self, request_id: str, generation: str) -> Slot:
        """The generation named, else the one that admitted `request_id`, else the newest."""
        if generation:
            return self.get(generation)
        for slot in reversed(self._slots.values()):
            if slot.runtime.stage is not None and request_id in slot.runtime.stage.admissions:
                return slot
        return self.get("")

    def for_lease(self, lease_id: str, request_id: str, generation: str) -> Slot:
        """Admission: the generation named, else the one whose binding derives `lease_id`."""
        if generation or not lease_id:
            return self.get(generation)
        from libs.fnx2.wire.leases import derive_execution_lease_id

        for slot in self._slots.values():
            plan = slot.runtime.loaded().spec.plan
            if derive_execution_lease_id(plan.plan_generation_id, plan.plan_id, plan.plan_hash,
                                         request_id) == lease_id:
                return slot
        return self.get("")

    async def load(self, spec: LoadSpec) -> tuple[LoadedStage, Slot]:
        """Loads `spec` as its plan generation, beside the serving one if there is one."""
        generation = spec.plan.plan_generation_id
        async with self._lock:
            if generation in self._slots:
                raise FailedPrecondition(f"plan generation {generation} is already loaded; unload it first",
                                         reason="STAGE_LOADED")
            if len(self._slots) >= MAX_GENERATIONS:
                raise FailedPrecondition(
                    f"this worker already holds {len(self._slots)} plan generations "
                    f"({', '.join(self._slots)}); unload one first", reason="GENERATIONS_FULL")
            runtime = self._new_runtime()
            try:
                prepared = await runtime.prepare(spec)
            except BaseException:
                self._keep_if_idle(runtime)
                raise
            serving = self.newest()
            if serving is not None:
                refusal = overlap_refusal(serving.runtime.loaded_footprint(), runtime.footprint(prepared),
                                          self._memory())
                if refusal is not None:
                    log.warning("overlap_refused", generation=generation, serving=serving.generation,
                                detail=refusal.message)
                    raise refusal
            plane = self._primary if not self._primary.bound else await self._new_plane()
            try:
                stage = await runtime.load(prepared)
                await plane.bind(stage, runtime)
            except BaseException:
                if plane is not self._primary:
                    await plane.stop()
                self._keep_if_idle(runtime)
                raise
            slot = self._slots[generation] = Slot(generation, runtime, plane)
            return stage, slot

    def _keep_if_idle(self, runtime: StageRuntime) -> None:
        """A failed load is what health reports, unless another generation serves."""
        if not self._slots:
            self._last = runtime

    async def unload(self, generation: str = "", keep: str = "") -> Unloaded:
        """Unloads `generation`, or every generation but `keep` when none is named."""
        async with self._lock:
            if generation:
                names = [generation] if generation in self._slots else []
            else:
                names = [g for g in self._slots if g != keep]
            if not names and not generation and not self._slots:
                await self._last.unload()  # a failed load resets to unloaded
            live = kv = 0
            for name in names:
                slot = self._slots.pop(name)
                health = slot.runtime.health()
                live, kv = live + health.live_sequences, kv + health.kv_bytes_used
                await slot.plane.unbind()
                if slot.plane is not self._primary:
                    await slot.plane.stop()
                await slot.runtime.unload()
                self._last = slot.runtime
                log.info("generation_unloaded", generation=name, live_sequences=health.live_sequences,
                         kv_bytes_used=health.kv_bytes_used, still_loaded=list(self._slots))
            return Unloaded(tuple(names), live, kv)

    def state(self) -> StageState:
        """The newest generation's state, or the last runtime's when nothing is loaded."""
        newest = self.newest()
        return (newest.runtime if newest else self._last).lifecycle.state

    async def stop(self) -> None:
        for slot in list(self._slots.values()):
            if slot.plane is not self._primary:
                await slot.plane.stop()
