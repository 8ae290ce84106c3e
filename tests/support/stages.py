"""Start stage-worker processes for tests and load a pipeline onto them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.service.channels import open_channel
from services.orchestrator.route.direct_load import load_checkpoint_route
from services.orchestrator.route.stage_chain import RoutePlan
from tests.support.procs import ServiceProc


@dataclass
class StageFleet:
    procs: list[ServiceProc]
    addresses: list[str]

    def stub(self, index: int) -> pb_grpc.StageWorkerServiceStub:
        return pb_grpc.StageWorkerServiceStub(open_channel(self.addresses[index]))

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


def start_workers(count: int, workdir: Path, backend: str = "numpy") -> StageFleet:
    procs = []
    for i in range(count):
        (workdir / f"w{i}").mkdir(parents=True, exist_ok=True)
        env = {"FORNAX_STAGE_INDEX": str(i), "FORNAX_BACKEND": backend}
        procs.append(ServiceProc("services.stage_worker", workdir / f"w{i}", env=env))
    return StageFleet(procs, [p.wait_serving() for p in procs])


def load_pipeline(fleet: StageFleet, checkpoint: Path, layers: int, boundary: str = "fp32",
                  logits: bool = False, backend: str = "numpy") -> RoutePlan:
    return load_checkpoint_route(fleet.addresses, str(checkpoint), layers, boundary=boundary,
                                 backend=backend, logits=logits, timeout_s=600)
