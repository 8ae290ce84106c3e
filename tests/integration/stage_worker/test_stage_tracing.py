"""One trace across the gateway and every stage hop, carried inside the FNX2 frames."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from libs.fnx2.wire.messages import Phase
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.sampling import SamplingParams
from libs.service.trace_context import current_traceparent
from services.orchestrator.route.stage_chain import Route, route_slice
from tests.support.otlp import OtlpReceiver
from tests.support.procs import ServiceProc
from tests.support.stages import StageFleet, load_pipeline

pytestmark = pytest.mark.integration


def test_stage_hops_join_the_callers_trace(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "ckpt", seed=4)).out_dir
    cfg = load_config(checkpoint)
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "FORNAX_BACKEND": "numpy"}
        procs = []
        for index in range(2):
            (tmp_path / f"w{index}").mkdir()
            procs.append(ServiceProc("services.stage_worker", tmp_path / f"w{index}",
                                     env={**env, "FORNAX_STAGE_INDEX": str(index)}))
        fleet = StageFleet(procs, [p.wait_serving() for p in procs])
        try:
            plan = load_pipeline(fleet, checkpoint, cfg.num_hidden_layers)
            tracer = TracerProvider(resource=Resource.create({"service.name": "test-gateway"})).get_tracer("test")

            async def scenario():
                route = Route(plan)
                await route.open()
                try:
                    rid = str(uuid.uuid4())
                    await route.admit(rid, 8, SamplingParams())
                    with tracer.start_as_current_span("gateway") as root:
                        await route.run(Phase.PREFILL, [route_slice(plan, rid, 0, 0, 0, 2, 10**10)],
                                        np.array([3, 4], np.int32), current_traceparent())
                    context = root.get_span_context()
                    return format(context.trace_id, "032x"), format(context.span_id, "016x")
                finally:
                    await route.close()

            trace_id, root_span = asyncio.run(scenario())
        finally:
            fleet.stop()  # SIGTERM flushes each worker's span exporter
        workers = {"fornax-stage-worker-stage-0", "fornax-stage-worker-stage-1"}
        spans = receiver.wait_for(lambda got: workers <= {s.service_name for s in got if s.trace_id == trace_id})
    ours = [s for s in spans if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in ours}
    stage0 = next(s for s in ours if s.name == "stage-0 prefill")
    stage1 = next(s for s in ours if s.name == "stage-1 prefill")
    assert stage0.parent_span_id == root_span
    transfer = by_id[stage1.parent_span_id]
    assert transfer.name == "transfer to stage-1" and transfer.service_name == "fornax-stage-worker-stage-0"
    assert by_id[transfer.parent_span_id] is stage0
    for stage_span in (stage0, stage1):
        children = {s.name for s in ours if s.parent_span_id == stage_span.span_id}
        assert {"unpack", "queue", "compute"} <= children
    assert trace.get_tracer_provider() is not None
