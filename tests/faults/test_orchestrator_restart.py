"""kill -9 of the orchestrator mid-decode: the stages do not keep its sequences' KV forever.

Restarted, the orchestrator installs its plan as a new generation (every stage reloads, so
orphaned KV goes with the old generation) and serves again. Not restarted, every stage must
free the orphaned leases by itself within their deadline budget (the lease TTL)."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from apps.fleet.launcher import ServiceProcess
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from tests.faults.fleet import live_fleet, stream_completion

pytestmark = [pytest.mark.integration]
LEASE_TTL_S = 4.0  # every request's deadline budget, which is its lease's lifetime
ENV = {"FORNAX_DEFAULT_DEADLINE_S": str(LEASE_TTL_S), "FORNAX_RECOVERY_TIMEOUT_S": "0"}


def _live_sequences(fleet) -> list[int]:
    counts = []
    for name in ("stage_worker_0", "stage_worker_1"):
        with fleet.channel(name) as channel:
            reply = sw_grpc.StageWorkerServiceStub(channel).GetHealth(sw_pb.GetHealthRequest(), timeout=5)
        counts.append(reply.live_sequences)
    return counts


async def _orphan_streams(fleet, count: int) -> None:
    """Starts `count` long streams and kills the orchestrator once each has a token."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        started = [asyncio.Event() for _ in range(count)]
        tasks = [asyncio.create_task(stream_completion(session, fleet.state.api, [9 + i, 4, 2], 1500, started[i]))
                 for i in range(count)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
        os.kill(fleet.pid("orchestrator"), signal.SIGKILL)
        await asyncio.gather(*tasks)


def _restart_orchestrator(fleet) -> None:
    dead = next(s for s in fleet.launcher.started if s.spec.name == "orchestrator")
    fleet.launcher.started.remove(dead)
    pinned = {"FORNAX_HTTP_PORT": str(dead.ports["http"]), "FORNAX_GRPC_PORT": str(dead.ports["grpc"]),
              "FORNAX_METRICS_PORT": str(dead.ports["metrics"])}
    fresh = fleet.launcher.spawn(ServiceProcess(dead.spec.name, dead.spec.kind, dead.spec.module,
                                                {**dead.spec.env, **pinned}))
    fleet.launcher.wait_ready([fresh])


def test_a_restarted_orchestrator_fences_orphans_and_serves(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        asyncio.run(_orphan_streams(fleet, 8))
        assert sum(_live_sequences(fleet)) > 0  # the orphans' KV is still held
        _restart_orchestrator(fleet)
        fleet.wait_for(lambda: fleet.health()[0] == 200 if _answers(fleet) else False, 60,
                       "the restarted orchestrator serves")
        assert _live_sequences(fleet) == [0, 0]


def test_stages_free_orphaned_kv_within_the_lease_ttl(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        asyncio.run(_orphan_streams(fleet, 8))
        fleet.wait_for(lambda: _live_sequences(fleet) == [0, 0], LEASE_TTL_S + 5,
                       "every stage frees the orphaned leases")


def _answers(fleet) -> bool:
    try:
        fleet.health()
        return True
    except (OSError, ValueError):
        return False
