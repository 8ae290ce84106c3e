"""The interface the serving loop drives: a route of stages that executes microbatches.

An implementation runs every stage in order for a microbatch and returns, per sequence, the
FNX2 `SequenceResult` (KV epoch every stage holds afterwards, status, error) with the token
the last stage sampled. The slices going out are FNX2 `SequenceSlice`s too (`RequestSlice`),
whose execution lease the implementation sets. Several
microbatches may be in flight at once; an implementation keeps each stage's order.
Implementations: `InProcessPipeline` (stage executors in this process) and, over the
network, FNX2 frames to stage 0 with sampled tokens back from the last stage.
"""

from __future__ import annotations

from typing import Protocol

from services.orchestrator.engine.domain import Microbatch, ReleaseReport, RequestSliceResult, ServedModel, StageStats


class Pipeline(Protocol):
    @property
    def num_stages(self) -> int: ...

    @property
    def served(self) -> ServedModel:
        """The model the stages serve: context length, vocabulary and KV layout."""
        ...

    async def submit(self, batch: Microbatch) -> tuple[RequestSliceResult, ...]:
        """Runs the microbatch through every stage; one result per slice, in slice order, each
        the FNX2 `SequenceResult` with its sampled token. Per-sequence failures come back as
        statuses; an exception means the whole microbatch failed."""
        ...

    async def cancel(self, request_id: str) -> None:
        """Drops the request's in-flight rows on every stage; KV epochs stay as they are and
        the release still follows."""
        ...

    async def release(self, request_id: str, publish_token_ids: tuple[int, ...] = ()) -> ReleaseReport:
        """Frees the request's KV on every stage and reports each stage's epoch; with
        `publish_token_ids` (every token its KV holds) the stages first publish its full blocks
        for prefix reuse under the salt it was admitted with."""
        ...

    async def stage_stats(self) -> list[StageStats]:
        """Where each stage runs, its KV occupancy and its cumulative phase times."""
        ...

    async def close(self) -> None: ...
