"""A stage killed or stopped mid-decode: every stream ends cleanly and fast, the route says
DEGRADED everywhere an operator looks, new requests get 503 ROUTE_UNAVAILABLE, and every
admission slot comes back within the release budget."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from tests.faults.fleet import live_fleet, stream_completion

pytestmark = [pytest.mark.integration]
STREAMS = 16
DEADLINE_S = 60.0
# Detection is two probe rounds (1 s health probe, 0.5 s apart) that time out with no
# data-plane progress; the round the stop lands in may still carry RESULTs from before it.
END_WITHIN_S = 8.0
RELEASE_BUDGET_S = 3.0
# Without a restarted worker there is nothing to replay on: fail fast (no recovery wait).
ENV = {"FORNAX_DEFAULT_DEADLINE_S": str(DEADLINE_S),
       "FORNAX_RELEASE_BUDGET_S": str(RELEASE_BUDGET_S),
       "FORNAX_RECOVERY_TIMEOUT_S": "0"}


async def _streams_through_fault(api: str, fault) -> tuple[list, float]:
    """Starts STREAMS long streams, applies `fault` once each has a token, reads them out."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S + 30)) as session:
        started = [asyncio.Event() for _ in range(STREAMS)]
        tasks = [asyncio.create_task(stream_completion(session, api, [5 + i, 17, 42], 400, started[i]))
                 for i in range(STREAMS)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        fault()
        fault_at = time.monotonic()
        return await asyncio.gather(*tasks), fault_at


def _assert_clean_unavailable(code: str | None, message: str) -> None:
    assert code == "route_unavailable", (code, message)
    assert "127.0.0.1" not in message and "ipv4" not in message.lower()


def _health_naming(fleet, text: str):
    status, body = fleet.health()
    return (status, body) if status != 200 and text in body["error"]["message"] else None


def _new_request(api: str):
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await stream_completion(session, api, [5, 6, 7], 4)
    return asyncio.run(main())


def _status_cli(state_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", "status", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=60)


def test_kill_9_of_a_stage_mid_decode_degrades_the_route(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        victim = fleet.pid("stage_worker_1")
        outcomes, fault_at = asyncio.run(_streams_through_fault(
            fleet.state.api, lambda: os.kill(victim, signal.SIGKILL)))
        for outcome in outcomes:  # every stream ended, with a clean terminal error, fast
            assert outcome.tokens >= 1
            _assert_clean_unavailable(outcome.error_code, outcome.error_message)
            assert outcome.finished_at - fault_at < END_WITHIN_S
        # The data plane failure degrades at once; the health probes then name the stage.
        status, body = fleet.wait_for(lambda: _health_naming(fleet, "stage 1 is unreachable"),
                                      5, "/health names the dead stage")
        assert status == 503
        _assert_clean_unavailable(body["error"]["code"], body["error"]["message"])
        plan = fleet.plan_status()
        assert plan.state == pb.ROUTE_STATE_DEGRADED and "stage 1" in plan.reason
        assert [s.healthy for s in plan.stages] == [True, False]
        assert fleet.metric("fornax_orchestrator_route_degraded") == 1.0
        refused = _new_request(fleet.state.api)
        assert refused.status == 503
        _assert_clean_unavailable(refused.error_code, refused.error_message)
        # Every admission slot comes back within the release budget; the logs stay quiet.
        fleet.wait_for(lambda: fleet.metric("fornax_orchestrator_live_requests") == 0,
                       RELEASE_BUDGET_S + 5, "every admission slot is free")
        log = fleet.log("orchestrator")
        assert log.count("Traceback") == 0
        assert log.count('"release_failed"') <= 10
        cli = _status_cli(fleet.state_dir)
        assert cli.returncode == 1 and "DEGRADED" in cli.stdout and "stage 1" in cli.stdout
        forced = fleet.launcher.stop_all()
        assert "orchestrator" not in forced


def test_sigstop_of_a_stage_ends_streams_before_their_deadline_and_recovers(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        victim = fleet.pid("stage_worker_1")
        try:
            outcomes, fault_at = asyncio.run(_streams_through_fault(
                fleet.state.api, lambda: os.kill(victim, signal.SIGSTOP)))
            for outcome in outcomes:
                assert outcome.error_code is not None, outcome
                _assert_clean_unavailable(outcome.error_code, outcome.error_message)
                assert outcome.finished_at - fault_at < END_WITHIN_S < DEADLINE_S
            ended_s = max(o.finished_at for o in outcomes) - fault_at
            print(f"sigstop_last_stream_ended_s={ended_s:.2f} (physical, this host)")
            status, body = fleet.wait_for(
                lambda: _health_naming(fleet, "stage 1 is unresponsive"), 5,
                "/health names the stopped stage")
            assert status == 503
            assert fleet.plan_status().state == pb.ROUTE_STATE_DEGRADED
            assert _new_request(fleet.state.api).status == 503
        finally:
            os.kill(victim, signal.SIGCONT)
        # The stage resumes under the same plan generation: the route serves again.
        fleet.wait_for(lambda: fleet.health()[0] == 200, 15, "the route recovers after SIGCONT")
        assert fleet.plan_status().state == pb.ROUTE_STATE_SERVING
        after = _new_request(fleet.state.api)
        assert after.status == 200 and after.error_code is None and after.tokens >= 1
        fleet.wait_for(lambda: fleet.metric("fornax_orchestrator_live_requests") == 0,
                       RELEASE_BUDGET_S + 5, "every admission slot is free")


def test_an_unloaded_stage_and_a_drained_route_show_in_status(tmp_path, checkpoint):
    from fornax.orchestrator.v1 import orchestrator_pb2_grpc as orch_grpc
    from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc

    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        with fleet.channel("stage_worker_1") as channel:
            sw_grpc.StageWorkerServiceStub(channel).UnloadStage(
                sw_pb.UnloadStageRequest(request_id="unload-1"), timeout=30)
        status, body = fleet.wait_for(lambda: _health_naming(fleet, "stage 1 is not loaded"), 5,
                                      "/health names the unloaded stage")
        assert status == 503
        cli = _status_cli(fleet.state_dir)
        assert cli.returncode == 1 and "DEGRADED (stage 1 is not loaded)" in cli.stdout
        assert "stage_worker_1 UNLOADED" in cli.stdout
        with fleet.channel("orchestrator") as channel:
            drained = orch_grpc.OrchestratorServiceStub(channel).DrainPlan(
                pb.DrainPlanRequest(request_id="drain-1", timeout_ns=10**9), timeout=30)
        assert drained.status.state == pb.ROUTE_STATE_DRAINED
        cli = _status_cli(fleet.state_dir)
        assert cli.returncode == 1 and "route: DRAINED" in cli.stdout
