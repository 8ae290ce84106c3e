"""A Pipeline over stage workers: FNX2 batches to stage 0, sampled tokens back from the last.

It adapts the scheduler's microbatches to `services.orchestrator.route.stage_chain.Route`: a request is admitted
on every stage (KV reserved, sampling recorded on the final stage) right before its prefill,
each microbatch travels as one ragged FNX2 BATCH of the slices' own `SequenceSlice`s (with the
route's execution lease), and each `SequenceResult` comes back with its sampled token.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import structlog

from libs.fnx2 import ErrorCode, SequenceResult, SequenceSlice
from libs.model.logprobs import decode_record, is_record_row
from libs.service.errors import FornaxError
from libs.service.log_limit import LogLimiter
from libs.service.trace_context import current_traceparent
from services.orchestrator.engine.domain import (
    Microbatch,
    Phase,
    ReleaseReport,
    RequestSlice,
    RequestSliceResult,
    SequenceStatus,
    ServedModel,
    StageStats,
    failed_result,
)
from services.orchestrator.engine.tracing import microbatch_span
from services.orchestrator.engine.unavailable import ROUTE_UNAVAILABLE
from services.orchestrator.route.stage_chain import PrefixQuery, Route, lease_id_for

# The per-sequence code a stage reports when its runtime or its next hop failed.
STAGE_RUNTIME_FAILURE = ErrorCode.FAILED
_LOGS = LogLimiter()
_log = structlog.get_logger()
_STATUS_BY_CODE: dict[str, SequenceStatus] = {
    ErrorCode.DEADLINE: SequenceStatus.DEADLINE,
    ErrorCode.CANCELLED: SequenceStatus.CANCELLED,
    ErrorCode.ADMISSION: SequenceStatus.REJECTED,
}


class RoutePipeline:
    def __init__(self, route: Route, served: ServedModel) -> None:
        if len(route.plan.stages) != served.num_stages:
            raise ValueError(f"route has {len(route.plan.stages)} stages, the served model "
                             f"{served.num_stages}")
        self._route = route
        self.served = served
        # Each live request's execution lease id (a hash of the plan and the request id),
        # derived once instead of at every decode step; dropped at release.
        self._lease_ids: dict[str, str] = {}

    @property
    def num_stages(self) -> int:
        return self.served.num_stages

    async def submit(self, batch: Microbatch) -> tuple[RequestSliceResult, ...]:
        rejected: dict[str, RequestSliceResult] = {}
        cached: dict[str, int] = {}
        leased = [s.with_lease(self._lease_id(s.request_id)) for s in batch.slices]
        if batch.phase is Phase.PREFILL:  # the first chunk of a prompt opens the lease
            rejected, cached = await self._admit(tuple(s for s in leased
                                                       if s.sequence.request_sequence_no == 0))
        runnable = [s for s in leased if s.request_id not in rejected]
        outputs: dict[str, tuple[SequenceResult, np.ndarray | None]] = {}
        if runnable:
            # One span per microbatch, in its first request's trace; its traceparent rides in
            # the FNX2 frame so every stage's hop joins that trace.
            with microbatch_span(batch.phase.value, [s.traceparent for s in runnable]) as span:
                span.set_attribute("fornax.phase", batch.phase.value)
                span.set_attribute("fornax.sequences", len(runnable))
                span.set_attribute("fornax.rows", batch.row_count)
                inputs = [_skipping(s, cached.get(s.request_id, 0)) for s in runnable]
                answers = await self._route.run(
                    batch.phase, [sequence for sequence, _ in inputs],
                    np.fromiter((t for _, ids in inputs for t in ids), dtype=np.int32), current_traceparent())
            outputs = {result.request_id: (result, rows) for result, rows in answers}
        return tuple(rejected.get(s.request_id) or _result(s, *outputs[s.request_id], cached.get(s.request_id, 0))
                     for s in leased)

    async def _admit(self, slices: tuple[RequestSlice, ...]
                     ) -> tuple[dict[str, RequestSliceResult], dict[str, int]]:
        """Admit each lease; returns the refusals and, per admitted request, the leading tokens
        of its first slice that every stage already holds (prefill starts after them)."""
        outcomes = await asyncio.gather(*(self._route.admit(
            s.request_id, s.kv_reserve_tokens, s.sampling,
            prefix=None if s.prefix_salt is None else PrefixQuery(s.prefix_salt, s.prefix_token_ids))
            for s in slices), return_exceptions=True)
        refused = {s.request_id: _refused(s, o) for s, o in zip(slices, outcomes, strict=True)
                   if isinstance(o, Exception)}
        cached = {s.request_id: o for s, o in zip(slices, outcomes, strict=True)
                  if isinstance(o, int) and o > 0}
        return refused, cached

    def _lease_id(self, request_id: str) -> str:
        lease_id = self._lease_ids.get(request_id)
        if lease_id is None:
            lease_id = self._lease_ids[request_id] = lease_id_for(self._route.plan, request_id)
        return lease_id

    async def cancel(self, request_id: str) -> None:
        await self._route.cancel(request_id)

    async def release(self, request_id: str, publish_token_ids: tuple[int, ...] = ()) -> ReleaseReport:
        self._lease_ids.pop(request_id, None)
        return ReleaseReport(request_id, tuple(await self._route.release(request_id, publish_token_ids)))

    async def stage_stats(self) -> list[StageStats]:
        healths = await self._route.health()
        return [_stage_stats(stage.index, stage.control_address, h)
                for stage, h in zip(self._route.plan.stages, healths, strict=True)]

    async def close(self) -> None:
        await self._route.close()

    @property
    def route(self) -> Route:
        return self._route


def _skipping(piece: RequestSlice, skip: int) -> tuple[SequenceSlice, tuple[int, ...]]:
    """The slice's FNX2 slice and token ids once `skip` leading prompt tokens are already in
    every stage's KV (a first chunk then runs on into the rest of the prompt,
    `RequestSlice.computed_token_ids`)."""
    if not skip:
        return piece.sequence, piece.token_ids
    ids = piece.computed_token_ids(skip)
    return piece.sequence._replace(token_position_start=piece.sequence.token_position_start + skip,
                                   input_row_count=len(ids)), ids


def _refused(piece: RequestSlice, error: Exception) -> RequestSliceResult:
    """A stage that is down makes the route unavailable; a stage that answered refused."""
    if isinstance(error, FornaxError) and error.reason == ROUTE_UNAVAILABLE:
        return failed_result(piece, error.message, route_lost=True)
    detail = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)
    return failed_result(piece, f"stage admission refused: {detail}", status=SequenceStatus.REJECTED,
                         error_code=ErrorCode.ADMISSION)


def _stage_stats(index: int, host: str, health) -> StageStats:
    t = health.phase_totals
    return StageStats(index, host, health.kv_bytes_used, health.kv_bytes_limit,
                      health.live_sequences, t.batches, t.queue_ns, t.compute_ns, t.pack_ns,
                      t.transfer_ns, t.unpack_ns, health.kv_blocks_free, health.kv_blocks_total,
                      health.prefix_hit_blocks, health.prefix_missed_blocks, health.kv_evicted_blocks)


def _result(piece: RequestSlice, result: SequenceResult, rows: np.ndarray | None,
            cached: int = 0) -> RequestSliceResult:
    ok = result.status is SequenceStatus.OK
    if ok and rows is not None and is_record_row(rows):
        record = decode_record(rows[0], piece.sampling.top_logprobs or 0)
        wanted = record if piece.sampling.top_logprobs is not None else None
        return RequestSliceResult(result, record.token_id, logprobs=wanted, cached_tokens=cached)
    if ok and rows is not None and rows.size == 1:
        return RequestSliceResult(result, int(rows.reshape(-1)[0]), cached_tokens=cached)
    if result.error_code == STAGE_RUNTIME_FAILURE:
        # A stage could not run the batch or reach its next hop: the route failed, not the
        # sequence. Its own words (which may name peers) go to the log, not to the client.
        if _LOGS.allow("stage_runtime_failure") is not None:
            _log.warning("stage_runtime_failure", request_id=piece.request_id,
                         error=result.error_message)
        return RequestSliceResult(result, None, "the route is unavailable: a stage failed while running the batch",
                                  route_lost=True)
    # The scheduler acts on the status the stage's code implies: an OK without a token failed.
    status = _STATUS_BY_CODE.get(result.error_code or "", SequenceStatus.FAILED)
    error = f"{result.error_code}: {result.error_message}" if result.error_code else \
        "the final stage returned no sampled token"
    return RequestSliceResult(result._replace(status=status), None, error)
