"""A Pipeline over stage workers: FNX2 batches to stage 0, sampled tokens back from the last.

It adapts the scheduler's microbatches to `services.orchestrator.stage_chain.Route`: a request is admitted
on every stage (KV reserved, sampling recorded on the final stage) right before its prefill,
each microbatch travels as one ragged FNX2 BATCH, and release fans out to every stage.
"""

from __future__ import annotations

import asyncio

import numpy as np

from libs.fnx2.errors import ErrorCode
from services.orchestrator.stage_chain import Route, SliceInput, SliceOutput, lease_id_for
from libs.service.trace_context import current_traceparent
from services.orchestrator.domain import (
    Microbatch,
    MicrobatchResult,
    Phase,
    ReleaseReport,
    RequestSlice,
    RequestSliceResult,
    SequenceStatus,
    ServedModel,
)
from services.orchestrator.tracing import microbatch_span

# FNX2 carries a deadline as a remaining budget and 0 means expired, so a request without a
# deadline travels with a day-long budget.
NO_DEADLINE_BUDGET_NS = 24 * 3600 * 10**9
_STATUS_BY_CODE = {ErrorCode.DEADLINE: SequenceStatus.DEADLINE, ErrorCode.CANCELLED: SequenceStatus.CANCELLED,
                   ErrorCode.ADMISSION: SequenceStatus.REJECTED}


class RoutePipeline:
    def __init__(self, route: Route, served: ServedModel) -> None:
        if len(route.plan.stages) != served.num_stages:
            raise ValueError(f"route has {len(route.plan.stages)} stages, the served model "
                             f"{served.num_stages}")
        self._route = route
        self.served = served

    @property
    def num_stages(self) -> int:
        return self.served.num_stages

    async def submit(self, batch: Microbatch) -> MicrobatchResult:
        rejected: dict[str, RequestSliceResult] = {}
        if batch.phase is Phase.PREFILL:  # the first chunk of a prompt opens the lease
            rejected = await self._admit(tuple(s for s in batch.slices
                                               if s.request_sequence_no == 0))
        runnable = [s for s in batch.slices if s.request_id not in rejected]
        outputs: dict[str, SliceOutput] = {}
        if runnable:
            # One span per microbatch, in its first request's trace; its traceparent rides in
            # the FNX2 frame so every stage's hop joins that trace.
            with microbatch_span(batch.phase.value, [s.traceparent for s in runnable]) as span:
                span.set_attribute("fornax.phase", batch.phase.value)
                span.set_attribute("fornax.sequences", len(runnable))
                span.set_attribute("fornax.rows", batch.row_count)
                results = await self._route.run(batch.phase, [self._input(s) for s in runnable],
                                                current_traceparent())
            outputs = {o.request_id: o for o in results}
        return MicrobatchResult(batch.batch_id, tuple(
            rejected.get(s.request_id) or _result(s, outputs[s.request_id])
            for s in batch.slices))

    async def _admit(self, slices: tuple[RequestSlice, ...]) -> dict[str, RequestSliceResult]:
        outcomes = await asyncio.gather(*(self._route.admit(
            s.request_id, s.kv_reserve_tokens, s.sampling)
            for s in slices), return_exceptions=True)
        return {s.request_id: RequestSliceResult(s.request_id, SequenceStatus.REJECTED, None,
                                             s.kv_epoch, f"stage admission refused: {o}")
                for s, o in zip(slices, outcomes) if isinstance(o, Exception)}

    def _input(self, piece: RequestSlice) -> SliceInput:
        budget = (NO_DEADLINE_BUDGET_NS if piece.deadline_budget_ns is None
                  else piece.deadline_budget_ns)
        return SliceInput(piece.request_id, lease_id_for(self._route.plan, piece.request_id),
                          piece.request_sequence_no, piece.token_position_start,
                          piece.kv_epoch, np.asarray(piece.token_ids, dtype=np.int32), budget)

    async def cancel(self, request_id: str) -> None:
        await self._route.cancel(request_id)

    async def release(self, request_id: str) -> ReleaseReport:
        return ReleaseReport(request_id, tuple(await self._route.release(request_id)))

    async def close(self) -> None:
        await self._route.close()


def _result(piece: RequestSlice, output: SliceOutput) -> RequestSliceResult:
    if output.ok and output.rows is not None and output.rows.size == 1:
        return RequestSliceResult(piece.request_id, SequenceStatus.OK, int(output.rows.reshape(-1)[0]),
                              output.kv_epoch_after)
    status = _STATUS_BY_CODE.get(output.error_code or "", SequenceStatus.FAILED)
    error = f"{output.error_code}: {output.error_message}" if output.error_code else \
        "the final stage returned no sampled token"
    return RequestSliceResult(piece.request_id, status, None, output.kv_epoch_after, error)
