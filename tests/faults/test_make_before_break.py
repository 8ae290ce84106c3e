"""A reinstall onto the same stage workers is make-before-break: while streams run, a plan with
another layer split is loaded and warmed beside the serving one, new requests switch to it, the
old generation finishes its streams and is unloaded; rollback restores the stored plan the same
way. Every stream completes with the text of an uninterrupted run and no request gets an error.
A worker that cannot hold both plans refuses, and the install fails closed with its reason."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest

from fornax.common.v1 import common_pb2
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.service.interceptors import reason_of
from tests.faults.fleet import LiveFleet, live_fleet

pytestmark = [pytest.mark.integration]
PROMPTS = ([5, 17, 42], [7, 8, 9, 10], [11, 3], [23, 29, 31, 37, 41])
STREAM_TOKENS = 48
WORKERS = ("stage_worker_0", "stage_worker_1")


@dataclass
class TimedStream:
    prompt: int
    status: int = 0
    text: str = ""
    error: str | None = None
    token_times: list[float] = field(default_factory=list)  # wall clock, as the services log it


async def timed_stream(session: aiohttp.ClientSession, api: str, prompt: int) -> TimedStream:
    """One greedy streaming completion; the arrival time of each chunk that carried text."""
    out = TimedStream(prompt)
    body = {"model": "fornax", "prompt": PROMPTS[prompt], "max_tokens": STREAM_TOKENS, "temperature": 0,
            "stream": True}
    async with session.post(f"{api}/completions", json=body) as response:
        out.status = response.status
        if response.status != 200:
            out.error = (await response.text())[:300]
            return out
        parts = []
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out.error = f"{event['error']['code']}: {event['error']['message']}"
                continue
            for choice in event.get("choices", ()):
                if choice.get("text"):
                    parts.append(choice["text"])
                    out.token_times.append(time.time())
        out.text = "".join(parts)
    return out


async def streams_through(api: str, operation, lanes: int = 4) -> tuple[list[TimedStream], object, float, float]:
    """Keeps `lanes` streams running back to back while `operation` (a blocking call) runs in a
    thread, and one second beyond; returns every stream, its result and its start/end times."""
    done = threading.Event()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = operation()
        except BaseException as exc:  # noqa: BLE001  (reported by the caller)
            outcome["error"] = exc
        finally:
            done.set()

    streams: list[TimedStream] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def lane(index: int) -> None:
            count = 0
            while not done.is_set() or time.time() < ended[0] + 1.0:
                streams.append(await timed_stream(session, api, (index + count) % len(PROMPTS)))
                count += 1

        ended = [float("inf")]
        runners = [asyncio.create_task(lane(i)) for i in range(lanes)]
        await asyncio.sleep(0.5)  # streams are running before the operation starts
        started = time.time()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        while not done.is_set():
            await asyncio.sleep(0.05)
        ended[0] = time.time()
        await asyncio.wait_for(asyncio.gather(*runners), 60)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return streams, outcome.get("value"), started, ended[0]


def reference_texts(api: str) -> list[str]:
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            return [await timed_stream(session, api, i) for i in range(len(PROMPTS))]
    runs = asyncio.run(main())
    assert all(r.status == 200 and r.error is None and r.text for r in runs), runs
    return [r.text for r in runs]


def worker_health(fleet: LiveFleet, worker: str, generation: str = "") -> sw_pb.GetHealthResponse:
    with fleet.channel(worker) as channel:
        return sw_grpc.StageWorkerServiceStub(channel).GetHealth(
            sw_pb.GetHealthRequest(plan_generation_id=generation), timeout=5)


def orchestrator(fleet: LiveFleet, call: str, message, timeout: float = 120):
    with fleet.channel("orchestrator") as channel:
        return getattr(pb_grpc.OrchestratorServiceStub(channel), call)(message, timeout=timeout)


def install_request(checkpoint, stages: int, allow_break_before_make: bool = False) -> pb.InstallPlanRequest:
    return pb.InstallPlanRequest(checkpoint_dir=str(checkpoint), stages=stages, backend=common_pb2.BACKEND_NUMPY,
                                 boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
                                 allow_break_before_make=allow_break_before_make)


def largest_gap(streams: list[TimedStream], start: float, end: float) -> float:
    """The largest wait between consecutive tokens of one stream, over tokens in [start, end]."""
    gaps = [b - a for s in streams for a, b in zip(s.token_times, s.token_times[1:], strict=False)
            if start <= b and a <= end]
    return max(gaps, default=0.0)


def assert_served_through(streams: list[TimedStream], reference: list[str], start: float, end: float) -> None:
    for stream in streams:
        assert stream.status == 200 and stream.error is None, (stream.status, stream.error)
        assert stream.text == reference[stream.prompt]
    # Streams were running when the new route took over: some started before the operation
    # ended and finished after it started.
    spanning = [s for s in streams if s.token_times and s.token_times[0] < end and s.token_times[-1] > start]
    assert spanning


def switch_times(fleet: LiveFleet) -> list[float]:
    """When the orchestrator pointed new requests at each new route (wall clock)."""
    from datetime import datetime

    return [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            for line in fleet.log("orchestrator").splitlines() if '"route_switched"' in line]


def retired_lines(fleet: LiveFleet) -> list[dict]:
    lines = [json.loads(line) for line in fleet.log("orchestrator").splitlines() if '"generation_retired"' in line]
    return lines


def test_reinstall_and_rollback_are_make_before_break_under_streams(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint) as fleet:
        api = fleet.state.api
        reference = reference_texts(api)
        first = fleet.plan_status()
        assert len(first.stages) == 2
        # The same load with nothing installed: the inter-token gap a reinstall is compared with.
        steady, _, start, end = asyncio.run(streams_through(api, lambda: time.sleep(3)))
        assert_served_through(steady, reference, start, end)
        steady_gap = largest_gap(steady, start, end)

        # A different layer split on the same workers: every layer on one stage.
        streams, reply, start, end = asyncio.run(streams_through(
            api, lambda: orchestrator(fleet, "InstallPlan", install_request(checkpoint, 1))))
        one = reply.status
        assert_served_through(streams, reference, start, end)
        install_gap = largest_gap(streams, start, end)
        (switched_at,) = switch_times(fleet)
        install_switch_gap = largest_gap(streams, switched_at - 0.5, switched_at + 0.5)
        assert one.state == pb.ROUTE_STATE_SERVING and len(one.stages) == 1
        old, new = first.plan.plan_generation_id, one.plan.plan_generation_id
        assert new != old
        # The old generation finished what it admitted, then was unloaded everywhere.
        retired = retired_lines(fleet)
        assert [(r["generation"], r["live_sequences"], r["kv_bytes_used"]) for r in retired] == [(old, 0, 0)]
        for worker in WORKERS:
            health = worker_health(fleet, worker)
            assert old not in health.loaded_plan_generation_ids
            assert worker_health(fleet, worker, old).state == sw_pb.STAGE_STATE_UNLOADED
        serving = [w for w in WORKERS if new in worker_health(fleet, w).loaded_plan_generation_ids]
        assert len(serving) == 1
        # New requests run on the new generation.
        before = worker_health(fleet, serving[0], new).batches_executed
        assert reference_texts(api) == reference
        after = worker_health(fleet, serving[0], new)
        assert after.batches_executed > before and after.plan.plan_generation_id == new
        assert after.live_sequences == 0 and after.kv_bytes_used == 0

        # Rollback restores the exact stored two-stage plan, make-before-break again.
        streams, reply, start, end = asyncio.run(streams_through(
            api, lambda: orchestrator(fleet, "RollbackPlan", pb.RollbackPlanRequest())))
        rolled = reply.status
        assert_served_through(streams, reference, start, end)
        rollback_gap = largest_gap(streams, start, end)
        switched_at = switch_times(fleet)[-1]
        rollback_switch_gap = largest_gap(streams, switched_at - 0.5, switched_at + 0.5)
        assert rolled.state == pb.ROUTE_STATE_SERVING
        assert (rolled.plan.plan_id, rolled.plan.plan_hash) == (first.plan.plan_id, first.plan.plan_hash)
        assert [(s.layer_range.layer_start, s.layer_range.layer_end_exclusive) for s in rolled.stages] == [
            (s.layer_range.layer_start, s.layer_range.layer_end_exclusive) for s in first.stages]
        assert rolled.plan.plan_generation_id not in (old, new)
        assert [r["live_sequences"] for r in retired_lines(fleet)] == [0, 0]
        for worker in WORKERS:
            assert list(worker_health(fleet, worker).loaded_plan_generation_ids) == [rolled.plan.plan_generation_id]
        print(f"\nlargest inter-token gap of 4 back-to-back greedy streams (physical, this host, numpy, tiny "
              f"checkpoint): steady {steady_gap:.3f} s; across a make-before-break reinstall {install_gap:.3f} s "
              f"(within 0.5 s of the switch {install_switch_gap:.3f} s); across a rollback {rollback_gap:.3f} s "
              f"(within 0.5 s of the switch {rollback_switch_gap:.3f} s); {len(streams)} streams in the rollback "
              f"window")


def test_a_worker_that_cannot_hold_both_plans_fails_the_install_closed(tmp_path, checkpoint):
    # A one-byte limit: the first plan loads (nothing to overlap), a second never fits.
    with live_fleet(tmp_path, checkpoint, {"FORNAX_MEMORY_LIMIT_BYTES": "1"}) as fleet:
        first = fleet.plan_status()
        with pytest.raises(grpc.RpcError) as refused:
            orchestrator(fleet, "InstallPlan", install_request(checkpoint, 2))
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(refused.value) == "INSUFFICIENT_MEMORY_FOR_OVERLAP"
        assert "memory limit is 1" in refused.value.details()
        # The serving route is untouched: same generation, serving, only it loaded.
        after = fleet.plan_status()
        assert after.state == pb.ROUTE_STATE_SERVING
        assert after.plan.plan_generation_id == first.plan.plan_generation_id
        for worker in WORKERS:
            assert list(worker_health(fleet, worker).loaded_plan_generation_ids) == [first.plan.plan_generation_id]
        assert reference_texts(fleet.state.api)
        # Only the operator's explicit consent trades the overlap for a serving gap.
        allowed = orchestrator(fleet, "InstallPlan", install_request(checkpoint, 2, allow_break_before_make=True))
        assert allowed.status.state == pb.ROUTE_STATE_SERVING
        assert allowed.status.plan.plan_generation_id != first.plan.plan_generation_id
        assert '"break_before_make"' in fleet.log("orchestrator")
