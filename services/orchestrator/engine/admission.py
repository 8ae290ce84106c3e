"""Admission: reserve queue space and KV blocks on every stage before a request runs.

A request reserves `blocks_for(prompt + max_tokens)` KV blocks on every stage, the same
whole-block reservation a stage worker makes, so a request admitted here is never refused by a
stage for KV and never needs a block that eviction would have to take from a live lease.

When the blocks are not free now, the policy decides (`--kv-full`):
- `queue` (default): the request waits, first come first served, and is admitted once
  releases free enough blocks; its deadline keeps running while it waits;
- `reject`: it is refused at once with KV_BLOCKS_FULL (HTTP 429), naming the blocks it needs
  and the blocks free.
A request that needs more blocks than a stage holds in all is refused at once under either
policy with KV_NEVER_FITS: waiting could never help it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

from libs.model.kv_blocks import blocks_for
from libs.service.errors import InvalidArgument, ResourceExhausted, Unavailable
from services.orchestrator.engine.domain import StageLayout


class KvFullPolicy(enum.Enum):
    QUEUE = "queue"
    REJECT = "reject"

    @classmethod
    def parse(cls, value: str) -> KvFullPolicy:
        try:
            return cls(value)
        except ValueError:
            raise InvalidArgument(f"kv-full policy {value!r} is not one of queue, reject",
                                  reason="INVALID_KV_FULL", field="kv_full") from None


@dataclass(frozen=True)
class AdmissionConfig:
    max_live_requests: int
    # Per stage, in stage order: bytes of KV cache this route may fill on that stage.
    stage_kv_budget_bytes: tuple[int, ...]
    kv_full: KvFullPolicy = KvFullPolicy.QUEUE


@dataclass(frozen=True)
class Reservation:
    request_id: str
    tokens: int
    stage_kv_blocks: tuple[int, ...]


@dataclass(frozen=True)
class KvShortfall:
    """The stage that cannot hold a request now (or ever), in blocks of `block_tokens`."""

    stage: int
    needed_blocks: int
    free_blocks: int
    total_blocks: int
    block_tokens: int
    # KV bytes one block costs on the stage (0 = not known): the refusal names the bytes too.
    block_bytes: int = 0

    def as_body(self) -> dict[str, int]:
        return {"stage": self.stage, "needed": self.needed_blocks, "free": self.free_blocks,
                "total": self.total_blocks, "block_tokens": self.block_tokens}


class KvBlocksFull(ResourceExhausted):
    """Not enough KV blocks are free now (policy reject); retrying later may succeed."""

    default_reason = "KV_BLOCKS_FULL"

    def __init__(self, shortfall: KvShortfall, tokens: int) -> None:
        s = shortfall
        super().__init__(
            f"KV space on stage {s.stage} exhausted: the request needs {s.needed_blocks} blocks "
            f"({tokens} tokens in blocks of {s.block_tokens}), {s.free_blocks} of {s.total_blocks} "
            f"blocks are free")
        self.kv_shortfall = shortfall


def _in_bytes(s: KvShortfall) -> str:
    if not s.block_bytes:
        return ""
    return f" ({s.needed_blocks * s.block_bytes} KV bytes needed, {s.total_blocks * s.block_bytes} held)"


class KvNeverFits(InvalidArgument):
    """The request needs more blocks than the stage holds in all: no wait can admit it."""

    default_reason = "KV_NEVER_FITS"

    def __init__(self, shortfall: KvShortfall, tokens: int) -> None:
        s = shortfall
        super().__init__(
            f"KV space on stage {s.stage} can never hold the request: it needs {s.needed_blocks} "
            f"blocks ({tokens} tokens: prompt + max_tokens, in blocks of {s.block_tokens}), the stage "
            f"holds {s.total_blocks}{_in_bytes(s)}", field="max_tokens")
        self.kv_shortfall = shortfall


@dataclass(frozen=True)
class AdmissionSnapshot:
    live_requests: int
    stage_kv_reserved_blocks: tuple[int, ...]
    queued_requests: int = 0


def stage_blocks(stage: StageLayout, budget_bytes: int) -> int:
    """Blocks the stage holds for this route: its own count when known, else the budget's
    whole blocks (at least one, as a stage's pool has)."""
    if stage.kv_blocks_total is not None:
        return stage.kv_blocks_total
    return max(1, budget_bytes // (stage.kv_block_tokens * stage.kv_bytes_per_token))


class AdmissionControl:
    def __init__(self, config: AdmissionConfig, stages: tuple[StageLayout, ...]) -> None:
        if len(config.stage_kv_budget_bytes) != len(stages):
            raise InvalidArgument(
                f"{len(config.stage_kv_budget_bytes)} KV budgets for {len(stages)} stages",
                reason="KV_BUDGET", field="stage_kv_budget_bytes")
        self._config = config
        self._stages = stages
        self._total = tuple(stage_blocks(s, b) for s, b in
                            zip(stages, config.stage_kv_budget_bytes, strict=True))
        self._reserved = [0] * len(stages)
        self._live: dict[str, Reservation] = {}
        self._waiting: OrderedDict[str, int] = OrderedDict()  # request id -> tokens, oldest first
        self._closed_reason: str | None = None

    @property
    def policy(self) -> KvFullPolicy:
        return self._config.kv_full

    def close(self, reason: str) -> None:
        """Stops new admissions (drain); reservations already held stay until released."""
        self._closed_reason = reason

    def reserve(self, request_id: str, tokens: int) -> Reservation | None:
        """Reserves the blocks of `tokens` (prompt + max_tokens) on every stage.

        Returns None when the request was queued for blocks instead (policy queue); raises a
        capacity error when it is refused.
        """
        if self._closed_reason is not None:
            raise Unavailable(f"route is not admitting: {self._closed_reason}",
                              reason="NOT_ADMITTING")
        if request_id in self._live or request_id in self._waiting:
            raise InvalidArgument(f"request {request_id} is already admitted",
                                  reason="DUPLICATE_REQUEST", field="request_id")
        if len(self._live) + len(self._waiting) >= self._config.max_live_requests:
            raise ResourceExhausted(
                f"request queue is full ({self._config.max_live_requests} live requests)")
        need = self._need(tokens)
        for index, (want, total) in enumerate(zip(need, self._total, strict=True)):
            if want > total:
                raise KvNeverFits(self._shortfall(index, want), tokens)
        short = self._short_stage(need)
        if short is None and not self._waiting:  # nobody overtakes a request already waiting
            return self._take(request_id, tokens, need)
        if self._config.kv_full is KvFullPolicy.REJECT:
            assert short is not None  # under reject nothing ever waits
            raise KvBlocksFull(self._shortfall(short, need[short]), tokens)
        self._waiting[request_id] = tokens
        return None

    def admit_waiting(self) -> list[Reservation]:
        """Admits waiting requests, oldest first, while the oldest one fits."""
        admitted = []
        while self._waiting:
            request_id, tokens = next(iter(self._waiting.items()))
            need = self._need(tokens)
            if self._short_stage(need) is not None:
                break
            del self._waiting[request_id]
            admitted.append(self._take(request_id, tokens, need))
        return admitted

    def release(self, request_id: str) -> None:
        """Returns a request's blocks, or takes it out of the wait for them."""
        self._waiting.pop(request_id, None)
        reservation = self._live.pop(request_id, None)
        if reservation is None:
            return
        for index, held in enumerate(reservation.stage_kv_blocks):
            self._reserved[index] -= held

    def _need(self, tokens: int) -> tuple[int, ...]:
        return tuple(blocks_for(tokens, stage.kv_block_tokens) for stage in self._stages)

    def _short_stage(self, need: tuple[int, ...]) -> int | None:
        return next((i for i, (want, used, total) in enumerate(zip(need, self._reserved, self._total, strict=True))
                     if used + want > total), None)

    def _shortfall(self, index: int, needed: int) -> KvShortfall:
        return KvShortfall(index, needed, self._total[index] - self._reserved[index], self._total[index],
                           self._stages[index].kv_block_tokens,
                           self._stages[index].kv_block_tokens * self._stages[index].kv_bytes_per_token)

    def _take(self, request_id: str, tokens: int, need: tuple[int, ...]) -> Reservation:
        for index, want in enumerate(need):
            self._reserved[index] += want
        reservation = Reservation(request_id=request_id, tokens=tokens, stage_kv_blocks=need)
        self._live[request_id] = reservation
        return reservation

    def free_tokens(self) -> int:
        """Tokens of KV still free to reserve on the fullest stage (none while requests wait)."""
        if self._waiting:
            return 0
        return min(((total - used) * stage.kv_block_tokens for stage, used, total in
                    zip(self._stages, self._reserved, self._total, strict=True)), default=0)

    @property
    def closed_reason(self) -> str | None:
        return self._closed_reason

    def holds(self, request_id: str) -> bool:
        return request_id in self._live

    def waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def snapshot(self) -> AdmissionSnapshot:
        return AdmissionSnapshot(live_requests=len(self._live),
                                 stage_kv_reserved_blocks=tuple(self._reserved),
                                 queued_requests=len(self._waiting))
