"""RoutePipeline's adaptation of microbatches to a Route, against a scripted Route."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import pytest

from libs.fnx2 import SequenceResult, Timings
from libs.service.errors import ResourceExhausted
from services.orchestrator.engine.domain import (
    NO_DEADLINE_BUDGET_NS,
    Microbatch,
    Phase,
    RequestSlice,
    SamplingParams,
    SequenceStatus,
    ServedModel,
    StageLayout,
    request_slice,
)
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.stage_chain import RoutePlan, RouteStage

PLAN = RoutePlan("4b0b6a4e-5d2c-4c1e-9a43-0f8e6d1c2b3a", "hash",
                 "9e2f3c1d-7a6b-4e5f-8d9c-1a2b3c4d5e6f",
                 (RouteStage(0, "a:1", "a:2", "m0"), RouteStage(1, "b:1", "b:2", "m1")))
SERVED = ServedModel("m", 64, 512, (StageLayout(0, 2, 8), StageLayout(2, 4, 8)))


@dataclass
class ScriptedRoute:
    plan: RoutePlan = PLAN
    refuse: set[str] = field(default_factory=set)
    admitted: list[tuple[str, int, float]] = field(default_factory=list)
    runs: list[tuple[Phase, list, list]] = field(default_factory=list)  # phase, slices, each one's ids
    outputs: dict[str, tuple[SequenceResult, np.ndarray | None]] = field(default_factory=dict)
    traceparents: list = field(default_factory=list)
    cached: int = 0  # the tokens every stage holds, answered to a prefix query
    prefixes: list = field(default_factory=list)
    published: list = field(default_factory=list)

    async def admit(self, request_id, reserve_tokens, sampling, logits=False, prefix=None):
        if request_id in self.refuse:
            raise ResourceExhausted("stage 1 KV full")
        self.admitted.append((request_id, reserve_tokens, sampling.temperature))
        self.prefixes.append(prefix)
        return self.cached if prefix is not None else 0

    async def run(self, phase, slices, token_ids, traceparent=None):
        assert token_ids.dtype == np.int32 and token_ids.size == sum(s.input_row_count for s in slices)
        ends = np.cumsum([s.input_row_count for s in slices])
        self.runs.append((phase, list(slices), [ids.tolist() for ids in np.split(token_ids, ends[:-1])]))
        self.traceparents.append(traceparent)
        return [self.outputs.get(s.request_id) or (_result(s, SequenceStatus.OK, s.kv_epoch + 1),
                                                  np.array([7], np.int32)) for s in slices]

    async def release(self, request_id, publish_token_ids=()):
        self.published.append((request_id, tuple(publish_token_ids)))
        return [3, 3]

    async def close(self):
        pass


def _result(s, status, kv_epoch_after, error_code=None, error_message=None) -> SequenceResult:
    ok = status is SequenceStatus.OK
    return SequenceResult(s.request_id, s.execution_lease_id, s.request_sequence_no, status, s.input_row_start,
                          s.input_row_count, 0 if ok else None, 1 if ok else 0, s.kv_epoch, kv_epoch_after,
                          error_code, error_message, Timings())


def piece(rid: str, rows: int = 3, deadline=None, epoch: int = 0) -> RequestSlice:
    return request_slice(rid, 0, tuple(range(1, rows + 1)), 0, epoch, deadline,
                         SamplingParams(temperature=0.5, seed=9), 0, rows + 10)


def test_prefill_admits_then_runs_and_maps_results():
    route = ScriptedRoute(refuse={"b"})
    route.outputs["c"] = (_result(piece("c").sequence, SequenceStatus.DEADLINE, 0, "DEADLINE", "budget spent"), None)
    pipeline = RoutePipeline(route, SERVED)
    batch = Microbatch(4, 0, Phase.PREFILL, (piece("a", deadline=500), piece("b"), piece("c")))
    result = asyncio.run(pipeline.submit(batch))
    assert [(s.request_id, s.status) for s in result] == [
        ("a", SequenceStatus.OK), ("b", SequenceStatus.REJECTED), ("c", SequenceStatus.DEADLINE)]
    assert result[0].sampled_token_id == 7
    assert result[0].kv_epoch_after == 1
    assert "stage 1 KV full" in result[1].error
    assert result[1].sequence.error_code == "ADMISSION"  # the refusal is an FNX2 result too
    assert result[2].error == "DEADLINE: budget spent"
    assert route.admitted == [("a", 13, 0.5), ("c", 13, 0.5)]
    ((phase, slices, ids),) = route.runs
    assert phase is Phase.PREFILL
    assert [s.request_id for s in slices] == ["a", "c"]  # the refused one never travels
    assert slices[0].deadline_budget_ns == 500
    assert slices[1].deadline_budget_ns == NO_DEADLINE_BUDGET_NS
    assert ids == [[1, 2, 3], [1, 2, 3]]


def test_a_reused_prefix_is_skipped_in_the_first_slice_and_reported():
    route = ScriptedRoute(cached=32)
    pipeline = RoutePipeline(route, SERVED)
    salted = request_slice("a", 0, tuple(range(40)), 0, 0, None, SamplingParams(), 0, 50,
                           prefix_salt=b"salt")
    result = asyncio.run(pipeline.submit(Microbatch(0, 0, Phase.PREFILL, (salted, piece("b")))))
    assert [p and (p.salt, p.token_ids) for p in route.prefixes] == [(b"salt", tuple(range(40))), None]
    ((_, slices, ids),) = route.runs
    assert (slices[0].token_position_start, slices[0].input_row_count, ids[0]) == (32, 8, list(range(32, 40)))
    assert (slices[1].token_position_start, len(ids[1])) == (0, 3)
    assert [s.cached_tokens for s in result] == [32, 0]


@pytest.mark.parametrize(("cached", "computed"), [(16, range(16, 48)), (48, range(48, 60)), (0, range(0, 32))])
def test_a_first_chunk_hashes_the_whole_prompt_and_runs_on_past_a_reused_prefix(cached, computed):
    route = ScriptedRoute(cached=cached)
    pipeline = RoutePipeline(route, SERVED)
    chunk = request_slice("a", 0, tuple(range(32)), 0, 0, None, SamplingParams(), 0, 70,
                          prefix_salt=b"salt", prefix_tail=tuple(range(32, 60)))
    result = asyncio.run(pipeline.submit(Microbatch(0, 0, Phase.PREFILL, (chunk,))))
    assert [(p.salt, p.token_ids) for p in route.prefixes] == [(b"salt", tuple(range(60)))]
    ((_, slices, ids),) = route.runs
    # At most the chunk's 32 rows are computed, starting after the reused tokens.
    assert (slices[0].token_position_start, ids[0]) == (cached, list(computed))
    assert result[0].cached_tokens == cached
    assert chunk.consumed_tokens(cached) == computed.stop


def test_decode_does_not_admit_and_release_reports_every_stage():
    route = ScriptedRoute()
    pipeline = RoutePipeline(route, SERVED)
    result = asyncio.run(pipeline.submit(Microbatch(5, 1, Phase.DECODE, (piece("a", 1, epoch=4),))))
    assert route.admitted == []
    assert route.runs[0][0] is Phase.DECODE
    assert result[0].kv_epoch_after == 5
    assert asyncio.run(pipeline.release("a")).stage_epochs == (3, 3)
    asyncio.run(pipeline.release("b", (5, 6, 7)))
    assert route.published == [("a", ()), ("b", (5, 6, 7))]  # the tokens whose blocks stages publish


def test_each_microbatch_is_a_span_in_its_request_trace_whose_traceparent_travels_in_the_frame(monkeypatch):
    from dataclasses import replace

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from services.orchestrator.engine import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(tracing, "TRACER", tracer)
    with tracer.start_as_current_span("request a") as request_span:
        from libs.service.trace_context import current_traceparent

        request_traceparent = current_traceparent()
    route = ScriptedRoute()
    traced = replace(piece("a", 1, epoch=2), traceparent=request_traceparent)
    asyncio.run(RoutePipeline(route, SERVED).submit(Microbatch(1, 0, Phase.DECODE, (traced, piece("b", 1, epoch=2)))))
    span = next(s for s in exporter.get_finished_spans() if s.name == "microbatch decode")
    assert span.parent.span_id == request_span.get_span_context().span_id
    assert span.context.trace_id == request_span.get_span_context().trace_id
    assert dict(span.attributes) == {"fornax.phase": "decode", "fornax.sequences": 2, "fornax.rows": 2}
    (traceparent,) = route.traceparents
    assert traceparent.split("-")[1] == f"{span.context.trace_id:032x}"
    assert traceparent.split("-")[2] == f"{span.context.span_id:016x}"


def test_a_request_keeps_its_lease_id_derived_once_until_release(monkeypatch):
    from services.orchestrator.route import route_pipeline
    from services.orchestrator.route.stage_chain import lease_id_for

    derived: list[str] = []

    def counting(plan, request_id):
        derived.append(request_id)
        return lease_id_for(plan, request_id)

    monkeypatch.setattr(route_pipeline, "lease_id_for", counting)
    route = ScriptedRoute()
    pipeline = RoutePipeline(route, SERVED)

    async def steps():
        await pipeline.submit(Microbatch(0, 0, Phase.PREFILL, (piece("a"), piece("b"))))
        for n in range(3):
            await pipeline.submit(Microbatch(1 + n, 0, Phase.DECODE, (piece("a", 1, epoch=1 + n),
                                                                      piece("b", 1, epoch=1 + n))))
        await pipeline.release("a")
        await pipeline.submit(Microbatch(9, 0, Phase.DECODE, (piece("b", 1, epoch=4),)))
        await pipeline.submit(Microbatch(10, 0, Phase.PREFILL, (piece("a"),)))  # the id again, anew

    asyncio.run(steps())
    # Once per live request, not at every step; a released request's entry is gone.
    assert derived == ["a", "b", "a"]
    expected = {rid: lease_id_for(PLAN, rid) for rid in ("a", "b")}
    assert all(s.execution_lease_id == expected[s.request_id] for _, slices, _ in route.runs for s in slices)


def test_the_route_lays_out_the_slices_rows_and_numbers_each_new_lease_in_the_batch_it_sends():
    from services.orchestrator.route.lease_numbers import LeaseNumbers
    from services.orchestrator.route.stage_chain import Route, route_slice

    async def build():
        route = Route(PLAN, numbers=LeaseNumbers())  # its gRPC channels need a running loop
        try:
            slices = [route_slice(PLAN, "a", 0, 0, 0, 3, 10**9), route_slice(PLAN, "b", 0, 0, 0, 2, 10**9)]
            with pytest.raises(ValueError, match="5 rows"):
                route._batch(Phase.PREFILL, slices, np.arange(4))
            return slices, route._batch(Phase.PREFILL, slices, np.arange(5)).batch.sequences
        finally:
            await route.close()

    slices, sent = asyncio.run(build())
    assert [(s.request_id, s.input_row_start, s.input_row_count) for s in sent] == [("a", 0, 3), ("b", 3, 2)]
    assert [s.lease_sequence for s in sent] == [0, 1]
    assert sent[0]._replace(lease_sequence=None) == slices[0]  # the caller's slice, otherwise as it was
