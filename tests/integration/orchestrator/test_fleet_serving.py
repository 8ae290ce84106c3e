"""The whole fleet: planner, artifact builder, two stage workers and the orchestrator as real
processes; the orchestrator installs the checkpoint at startup and serves the OpenAI API."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from libs.service.fleet_state import FleetState
from libs.text.context import TextContext
from tests.integration.orchestrator.test_greedy_parity import reference_greedy
from tests.support.fleet_tls import operator_channel

pytestmark = [pytest.mark.integration, pytest.mark.slow]
READY_TIMEOUT_S = 300


def wait_route_ready(api: str) -> dict:
    """Polls /health (503 while the plan installs) until it answers 200."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    health = api.removesuffix("/v1") + "/health"
    while True:
        try:
            with urllib.request.urlopen(health, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


@dataclass
class FleetUnderTest:
    state: FleetState
    state_dir: Path

    def __getattr__(self, name):
        return getattr(self.state, name)

    def channel(self, service: str):
        return operator_channel(self.state_dir, self.state.entry(service).grpc)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, checkpoint):
    options = FleetOptions(state_dir=tmp_path_factory.mktemp("fleet") / ".fornax", stages=2,
                           backend="numpy", boundary_dtype="fp32", checkpoint=str(checkpoint),
                           startup_timeout_s=180)
    state, launcher = start_fleet(options)
    try:
        yield FleetUnderTest(state, options.state_dir)
    finally:
        launcher.stop_all()


def test_openai_client_through_the_installed_fleet(fleet, checkpoint):
    health = wait_route_ready(fleet.api)
    assert health["stages"] == 2

    async def main():
        api = openai.AsyncOpenAI(base_url=fleet.api, api_key="none", max_retries=0)
        model = (await api.models.list()).data[0].id
        ids = [[5, 17, 42], [7, 8, 9, 10, 11]]
        streams = await asyncio.gather(*(api.completions.create(
            model=model, prompt=p, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}) for p in ids))
        results = []
        for stream in streams:
            chunks = [c async for c in stream]
            results.append(chunks)
        chat = await api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            temperature=0)
        return ids, results, chat

    ids, results, chat = asyncio.run(main())
    reference = reference_greedy(checkpoint, ids)
    tokenizer = TextContext.from_checkpoint(checkpoint).tokenizer
    for prompt_ids, chunks, expected in zip(ids, results, reference, strict=True):
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == tokenizer.decode(expected)  # greedy through 2 stages = transformers
        assert chunks[-1].usage.prompt_tokens == len(prompt_ids)
        assert chunks[-1].usage.completion_tokens == len(expected)
    assert chat.usage.completion_tokens >= 1


def test_drain_then_rollback_on_the_fleet(fleet, checkpoint):
    from fornax.common.v1 import common_pb2
    from fornax.orchestrator.v1 import orchestrator_pb2 as pb
    from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc

    wait_route_ready(fleet.api)
    stub = pb_grpc.OrchestratorServiceStub(fleet.channel("orchestrator"))
    first = stub.GetPlanStatus(pb.GetPlanStatusRequest()).current
    one_stage = stub.InstallPlan(pb.InstallPlanRequest(
        checkpoint_dir=str(checkpoint), stages=1, backend=common_pb2.BACKEND_NUMPY,
        boundary_dtype=common_pb2.ELEMENT_TYPE_FP32), timeout=300).status
    drained = stub.DrainPlan(pb.DrainPlanRequest(timeout_ns=30 * 10**9)).status
    with pytest.raises(openai.APIStatusError) as refused:
        asyncio.run(openai.AsyncOpenAI(base_url=fleet.api, api_key="none", max_retries=0)
                    .completions.create(model="fornax", prompt="x", max_tokens=2))
    rolled = stub.RollbackPlan(pb.RollbackPlanRequest(), timeout=300).status
    health = wait_route_ready(fleet.api)

    assert first.state == pb.ROUTE_STATE_SERVING and len(first.stages) == 2
    assert len(one_stage.stages) == 1
    assert drained.state == pb.ROUTE_STATE_DRAINED
    assert (refused.value.status_code, refused.value.body["code"]) == (503, "not_admitting")
    assert rolled.state == pb.ROUTE_STATE_SERVING and len(rolled.stages) == 2
    generations = {first.plan.plan_generation_id, one_stage.plan.plan_generation_id,
                   rolled.plan.plan_generation_id}
    assert len(generations) == 3  # every install fences the leases of the one before
    assert health["stages"] == 2


def test_32_concurrent_streams_through_the_fleet_then_kv_is_free(fleet):
    from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc

    wait_route_ready(fleet.api)

    async def one(api, model, i):
        stream = await api.completions.create(
            model=model, prompt=[5 + i, 9, 13], max_tokens=3 + i % 6, temperature=0.7, seed=i,
            stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        return finish, chunks[-1].usage.completion_tokens

    async def main():
        api = openai.AsyncOpenAI(base_url=fleet.api, api_key="none", max_retries=0)
        model = (await api.models.list()).data[0].id
        return await asyncio.gather(*(one(api, model, i) for i in range(32)))

    results = asyncio.run(main())
    for i, (finish, completion_tokens) in enumerate(results):
        if finish == "length":
            assert completion_tokens == 3 + i % 6
        else:
            assert finish == "stop" and 1 <= completion_tokens <= 3 + i % 6
    # Releases finish after the last event; poll the stages' own KV counters down to zero.
    deadline = time.monotonic() + 30
    while True:
        health = [sw_grpc.StageWorkerServiceStub(fleet.channel(f"stage_worker_{i}")).GetHealth(sw_pb.GetHealthRequest())
            for i in range(2)]
        if all(h.live_sequences == 0 and h.kv_bytes_used == 0 for h in health):
            break
        assert time.monotonic() < deadline, [(h.live_sequences, h.kv_bytes_used) for h in health]
        time.sleep(0.1)


def _data_plane_attempt(fleet, identity, target: str) -> str:
    """Open an FNX2 channel to target's data plane with identity's certificate: what happened."""
    import datetime as dt

    from libs.fnx2.channel.sender import SenderConfig
    from libs.fnx2.wire.control import ChannelBinding
    from libs.fnx2.wire.errors import Fnx2Error
    from libs.security.fnx2_tls import Fnx2Tls
    from libs.security.store import CertStore

    paths = CertStore(fleet.state_dir).ensure(identity, dt.datetime.now(dt.UTC))
    host, _, port = fleet.entry(target).extra["data_plane"].rpartition(":")
    binding = ChannelBinding("00000000-0000-4000-8000-000000000000", "sha256:" + "0" * 64,
                             "sha256:" + "0" * 64, "stage-1", "probe")

    async def attempt() -> str:
        try:
            client = await Fnx2Tls(paths).connect(host, int(port), SenderConfig(binding),
                                                  f"spiffe://fornax/stage/{target.replace('stage_worker_', 'stage-')}")
        except Fnx2Error as exc:
            return exc.code.value
        await client.close()
        return "BOUND"

    return asyncio.run(attempt())


def test_the_data_plane_admits_only_the_planned_previous_hop(fleet):
    import socket

    from libs.security.audit import read_entries
    from libs.security.identity import Identity, Role

    wait_route_ready(fleet.api)
    # Stage 1's previous hop is stage 0. Its own certificate, a client's, and the orchestrator's
    # (the gateway of stage 0, not of stage 1) are refused before any hello.
    for who in (Identity(Role.STAGE, "stage-1"), Identity(Role.CLIENT, "app"), Identity(Role.SERVICE, "orchestrator")):
        assert _data_plane_attempt(fleet, who, "stage_worker_1") == "PEER_REFUSED", who
    # The planned previous hop gets the hello; this probe's made-up binding then does not match.
    assert _data_plane_attempt(fleet, Identity(Role.STAGE, "stage-0"), "stage_worker_1") == "STALE_PLAN"
    # Plaintext gets no hello: the TLS listener answers a non-handshake with at most an alert
    # record (content type 21) and closes.
    host, _, port = fleet.entry("stage_worker_1").extra["data_plane"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"FNX2" + bytes(36))
        answer = b"".join(iter(lambda: raw.recv(4096), b""))
    assert answer == b"" or answer[0] == 21, answer[:16]
    refusals = [e.event for e in read_entries(fleet.state_dir / "audit" / "stage_worker_1.jsonl")
                if e.event.rpc == "fnx2:/hello"]
    assert [(e.caller, e.result) for e in refusals] == [
        ("spiffe://fornax/stage/stage-1", "PERMISSION_DENIED:PEER_REFUSED"),
        ("spiffe://fornax/client/app", "PERMISSION_DENIED:PEER_REFUSED"),
        ("spiffe://fornax/service/orchestrator", "PERMISSION_DENIED:PEER_REFUSED")]


def test_idle_tls_connections_to_a_stage_cost_little_memory(fleet):
    """100 authenticated peers that never answer the hello: the stage's resident memory while
    they are all open grows by a few MiB at most, and each is closed at its timeout. (Resident
    now, not the peak: this process peaked while loading its model.) TLS costs more than the
    plaintext listener's bound: OpenSSL keeps about 40 KiB of record buffers per connection."""
    import datetime as dt
    import ssl

    from libs.security.identity import Identity, Role
    from libs.security.store import CertStore
    from tests.integration.fnx2.test_idle_connections import status_bytes

    wait_route_ready(fleet.api)
    paths = CertStore(fleet.state_dir).ensure(Identity(Role.STAGE, "stage-0"), dt.datetime.now(dt.UTC))
    context = ssl.create_default_context(cafile=str(paths.ca))
    context.load_cert_chain(str(paths.cert), str(paths.key))
    host, _, port = fleet.entry("stage_worker_1").extra["data_plane"].rpartition(":")
    pid = fleet.entry("stage_worker_1").pid

    async def round_of_idle_peers() -> int:
        before = status_bytes(pid, "VmRSS")
        peers = [await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
                 for _ in range(100)]
        hellos = [await reader.read(8) for reader, _ in peers]  # the hello's first bytes
        grown = status_bytes(pid, "VmRSS") - before
        closed = [await asyncio.wait_for(reader.read(), 60) is not None for reader, _ in peers]
        for _, writer in peers:
            writer.close()
        assert all(h.startswith(b"FNX2") for h in hellos) and all(closed)
        return grown

    grown = asyncio.run(round_of_idle_peers())
    print(f"rss growth of a stage holding 100 idle TLS peers: {grown} bytes (physical)")
    assert grown < 8 * 1024 * 1024
