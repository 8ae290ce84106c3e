"""A deterministic stand-in for the stage pipeline that also checks FNX2 KV semantics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from services.orchestrator.engine.domain import (
    Microbatch,
    Phase,
    ReleaseReport,
    RequestSliceResult,
    sequence_ok,
)


class KvViolation(AssertionError):
    pass


@dataclass
class _Lease:
    next_sequence_no: int = 0
    next_position: int = 0
    epoch: int = 0
    decoded: bool = False


def default_script(request_id: str, sample_index: int) -> int:
    """Ordinary (non-special) token ids that depend only on the request and step."""
    return 10 + (sum(map(ord, request_id)) * 7 + sample_index * 13) % 200


@dataclass
class FakeStages:
    """Every stage keeps one lease per request; epochs go up by one per success."""

    num_stages: int
    script: Callable[[str, int], int] = default_script
    leases: list[dict[str, _Lease]] = field(default_factory=list)
    executed_batches: list[Microbatch] = field(default_factory=list)
    released: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.leases = [{} for _ in range(self.num_stages)]

    def answer(self, batch: Microbatch) -> tuple[int, tuple[RequestSliceResult, ...]]:
        """The batch executed, as `Scheduler.update_from_output` takes it."""
        return batch.batch_id, self.execute(batch)

    def execute(self, batch: Microbatch) -> tuple[RequestSliceResult, ...]:
        self.executed_batches.append(batch)
        results = []
        for piece in batch.slices:
            for stage in self.leases:
                self._check(stage, batch.phase, piece)
            epochs = []
            for stage in self.leases:
                lease = stage.setdefault(piece.request_id, _Lease())
                lease.epoch += 1
                lease.next_sequence_no += 1
                lease.next_position += len(piece.token_ids)
                lease.decoded = lease.decoded or batch.phase is Phase.DECODE
                epochs.append(lease.epoch)
            token = self.script(piece.request_id, piece.sample_index)
            assert len(set(epochs)) == 1
            results.append(RequestSliceResult(sequence_ok(piece, epochs[0]), token))
        return tuple(results)

    @staticmethod
    def _check(stage: dict[str, _Lease], phase: Phase, piece) -> None:
        lease = stage.get(piece.request_id)
        if lease is None:  # a lease opens with a prefill at sequence 0, position 0, epoch 0
            s = piece.sequence
            if phase is not Phase.PREFILL or (s.request_sequence_no, s.token_position_start, s.kv_epoch) != (0, 0, 0):
                raise KvViolation(f"bad first slice {piece}")
            return
        if phase is Phase.PREFILL and lease.decoded:
            raise KvViolation("prefill after decode")
        if phase is Phase.DECODE and len(piece.token_ids) != 1:
            raise KvViolation(f"decode with {len(piece.token_ids)} rows")
        got = (piece.sequence.request_sequence_no, piece.sequence.token_position_start, piece.sequence.kv_epoch)
        want = (lease.next_sequence_no, lease.next_position, lease.epoch)
        if got != want:
            raise KvViolation(f"decode {got} != expected {want} for {piece.request_id}")

    def release(self, request_id: str) -> ReleaseReport:
        epochs = tuple(stage.pop(request_id, _Lease()).epoch for stage in self.leases)
        self.released[request_id] = epochs
        return ReleaseReport(request_id, epochs)

    def live_kv(self) -> list[int]:
        return [len(stage) for stage in self.leases]


class FakePipeline:
    """Async `Pipeline` over FakeStages; `gate` lets a test hold microbatches in flight."""

    def __init__(self, num_stages: int, script: Callable[[str, int], int] = default_script):
        self.stages = FakeStages(num_stages, script)
        self.num_stages = num_stages
        self.gate = asyncio.Event()
        self.gate.set()
        self.max_inflight = 0
        self._inflight = 0
        self.cancelled: list[str] = []

    async def submit(self, batch: Microbatch) -> tuple[RequestSliceResult, ...]:
        self._inflight += 1
        self.max_inflight = max(self.max_inflight, self._inflight)
        try:
            await self.gate.wait()
            await asyncio.sleep(0)
            return self.stages.execute(batch)
        finally:
            self._inflight -= 1

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def release(self, request_id: str, publish_token_ids=()) -> ReleaseReport:
        await asyncio.sleep(0)
        return self.stages.release(request_id)

    async def close(self) -> None:
        return None


class FakeClock:
    """The engine's clock (monotonic ns), standing still until a test moves it."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)
