from __future__ import annotations

import pytest

from libs.service.fleet_state import FleetState, ServiceEntry
from services.stage_worker.config import StageWorkerConfig


def test_flags_win_over_env_and_env_over_defaults():
    env = {"FORNAX_GRPC_PORT": "5000", "FORNAX_STAGE_INDEX": "2", "FORNAX_BACKEND": "max"}
    cfg = StageWorkerConfig.from_env(["--grpc-port", "6000"], env)
    assert cfg.server.grpc_port == 6000
    assert cfg.stage_index == 2 and cfg.backend == "max"
    assert cfg.server.service_name == "fornax-stage-worker-stage-2"
    assert StageWorkerConfig.from_env([], {}).server.grpc_port == 0


def test_invalid_env_values_are_refused():
    with pytest.raises(SystemExit, match="FORNAX_GRPC_PORT"):
        StageWorkerConfig.from_env([], {"FORNAX_GRPC_PORT": "abc"})
    with pytest.raises(SystemExit, match="backend"):
        StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "cuda"})


def test_config_is_frozen():
    cfg = StageWorkerConfig.from_env([], {})
    with pytest.raises(AttributeError):
        cfg.stage_index = 3


def test_fleet_file_round_trips_and_keeps_api_key():
    state = FleetState(
        services=(ServiceEntry("planner", "planner", "127.0.0.1:1", "127.0.0.1:2", 42, "/tmp/p.log"),),
        api="http://127.0.0.1:8000/v1",
        api_key="k",
    )
    again = FleetState.from_json(state.to_json())
    assert again == state
    assert again.entry("planner").pid == 42


def test_stage_worker_advertises_a_configured_host():
    cfg = StageWorkerConfig.from_env([], {"FORNAX_HOST": "0.0.0.0", "FORNAX_ADVERTISE_HOST": "w-1.stages.ns.svc"})
    assert cfg.server.host == "0.0.0.0" and cfg.advertise_host == "w-1.stages.ns.svc"


def test_data_plane_address_uses_the_advertised_host():
    import asyncio

    from services.stage_worker.dataplane import DataPlane
    from services.stage_worker.runtime import StageRuntime

    async def main():
        plane = DataPlane(StageRuntime("numpy", "cpu", 1 << 20), "127.0.0.1", 0, "w-1.stages.ns.svc")
        await plane.start()
        try:
            return plane.address, plane.port
        finally:
            await plane.stop()

    address, port = asyncio.run(main())
    assert address == f"w-1.stages.ns.svc:{port}" and port > 0


def test_overlap_settings_come_from_the_environment():
    from services.orchestrator.config import OrchestratorConfig

    worker = StageWorkerConfig.from_env([], {"FORNAX_OVERLAP_DATA_PLANE_PORT": "7071",
                                             "FORNAX_MEMORY_LIMIT_BYTES": str(8 << 30)})
    assert (worker.overlap_data_plane_port, worker.memory_limit_bytes) == (7071, 8 << 30)
    assert (StageWorkerConfig.from_env([], {}).overlap_data_plane_port,
            StageWorkerConfig.from_env([], {}).memory_limit_bytes) == (0, 0)
    assert OrchestratorConfig.from_env([], {"FORNAX_DRAIN_TIMEOUT_S": "7"}).route.drain_timeout_s == 7.0
