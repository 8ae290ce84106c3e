"""A request's lease opens, cancels and closes on the FNX2 data plane: no request-path gRPC
call reaches a stage, each stage applies the admission and forwards it, and a refusal
anywhere comes back as ADMISSION with nothing left reserved."""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid

import numpy as np
import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.admission import Admission, OutputMode, Sampling
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.errors import ErrorCode
from libs.fnx2.wire.messages import Phase, SequenceStatus
from libs.model.config import load_config
from libs.model.sampling import SamplingParams
from services.orchestrator.route.stage_chain import Route, route_slice
from tests.support.stages import load_pipeline, start_workers

BUDGET_NS = 30_000_000_000
LEASE_RPCS = ("AdmitSequence", "CancelRequest", "ReleaseRequest")


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    fleet = start_workers(2, tmp_path_factory.mktemp("inband"))
    yield fleet
    fleet.stop()


def rpc_calls(fleet, method: str) -> int:
    """Calls of `method` each worker's gRPC server handled, from its Prometheus counters."""
    total = 0
    for proc in fleet.procs:
        text = urllib.request.urlopen(f"http://127.0.0.1:{proc.ports['metrics']}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("fornax_grpc_server_handling_seconds_count") and f"{method}\"" in line:
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_a_request_makes_no_lease_grpc_call_and_its_lease_is_released_in_band(checkpoint, workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(workers, checkpoint, cfg.num_hidden_layers)
    before = {m: rpc_calls(workers, m) for m in LEASE_RPCS}

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            rid = str(uuid.uuid4())
            await route.admit(rid, 16, SamplingParams())
            prompt = np.array([1, 2, 3], np.int32)
            ((first, _),) = await route.run(Phase.PREFILL, [route_slice(plan, rid, 0, 0, 0, 3, BUDGET_NS)], prompt)
            cancelled = await route.cancel(rid)
            released = await route.release(rid)
            return first, cancelled, released, await route.health()
        finally:
            await route.close()

    first, cancelled, released, after = asyncio.run(scenario())
    assert first.status is SequenceStatus.OK
    assert cancelled == [1, 1] and released == [1, 1]  # every stage answers, in chain order
    assert all(h.kv_bytes_used == 0 and h.live_sequences == 0 for h in after)
    assert {m: rpc_calls(workers, m) - before[m] for m in LEASE_RPCS} == dict.fromkeys(LEASE_RPCS, 0)
    assert rpc_calls(workers, "LoadStage") >= 2  # the counters are read: control still uses gRPC


def _admission(reserve_tokens: int) -> Admission:
    return Admission(str(uuid.uuid4()), str(uuid.uuid4()), reserve_tokens, OutputMode.SAMPLED_TOKENS, Sampling())


def test_a_stage_admits_from_the_data_channel_and_refuses_beyond_capacity(checkpoint, workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(workers, checkpoint, cfg.num_hidden_layers)
    first = plan.stages[0]
    binding = ChannelBinding(plan.plan_id, plan.plan_hash, first.manifest_hash, "stage-0", plan.plan_generation_id)
    host, _, port = first.data_plane_address.rpartition(":")

    async def scenario():
        client = await Fnx2Client.connect(host, int(port), SenderConfig(binding))
        try:
            refused = await client.admit(_admission(10**9))
            reserved_after_refusal = [h.live_sequences for h in await _healths(workers, plan)]
            ok = _admission(16)
            admitted = await client.admit(ok)
            released = await client.release(ok.request_id, ok.execution_lease_id)
            return refused, reserved_after_refusal, admitted, released
        finally:
            await client.close()

    refused, reserved_after_refusal, admitted, released = asyncio.run(scenario())
    assert not refused.admitted and refused.error_code == ErrorCode.ADMISSION.value
    assert refused.reason == "KV_CAPACITY" and refused.refused_by == "stage-0"
    assert re.search(r"KV blocks", refused.error_message or "")
    assert reserved_after_refusal == [0, 0]
    assert admitted.admitted and admitted.cached_tokens == (0, 0)  # one entry per stage
    assert released.stage_kv_epochs == (0, 0)


async def _healths(fleet, plan) -> list[pb.GetHealthResponse]:
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
    from libs.service.channels import open_aio_channel

    replies = []
    for address in fleet.addresses:
        async with open_aio_channel(address) as channel:
            replies.append(await pb_grpc.StageWorkerServiceStub(channel).GetHealth(
                pb.GetHealthRequest(plan_generation_id=plan.plan_generation_id), timeout=5))
    return replies
