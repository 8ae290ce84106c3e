"""What `fornax plan` reads from a running fleet: its workers' facts, the registry's newest
profiles, and the orchestrator's installed placement. Thin blocking I/O for the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from fornax.orchestrator.v1 import orchestrator_pb2 as orch_pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as orch_grpc
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.service.channels import ChannelConfig, open_channel
from libs.service.errors import FailedPrecondition
from libs.service.fleet_state import FleetState, read_fleet
from services.evidence_registry.client import ClientOptions
from services.planner.explain import InstalledStage
from services.planner.inventory import Inventory
from services.planner.inventory_facts import hosts_from_profiles, inventory_from, node_name
from services.planner.profile_source import fetch_profile_records
from services.planner.profiles import ProfileRecordInput


@dataclass(frozen=True)
class FleetView:
    state: FleetState
    workers: tuple[str, ...]
    hosts: tuple[str, ...]
    inventory: Inventory
    records: list[ProfileRecordInput]
    planner: str
    registry: str


def read_view(state_dir: str, channel: ChannelConfig) -> FleetView:
    state = read_fleet(state_dir)
    if state is None:
        raise FailedPrecondition(f"no running fleet in {state_dir} (fleet.json); start one with `fornax up`, or "
                                 "plan an inventory file with --inventory", reason="NO_FLEET")
    workers = tuple(s.grpc for s in sorted((s for s in state.services if s.kind == "stage_worker"),
                                           key=lambda s: int(s.name.rsplit("_", 1)[-1])))
    caps = []
    for address in workers:
        with open_channel(address, channel) as ch:
            caps.append(sw_grpc.StageWorkerServiceStub(ch).GetCapabilities(sw_pb.GetCapabilitiesRequest(), timeout=30))
    registry = state.entry("evidence_registry").grpc
    records = fetch_profile_records(registry, ClientOptions(channel=channel))
    hosts = hosts_from_profiles(caps, records)
    return FleetView(state, workers, hosts, inventory_from(caps, hosts), records, state.entry("planner").grpc,
                     registry)


def installed_stages(view: FleetView, channel: ChannelConfig) -> list[InstalledStage]:
    """The orchestrator's current route, each stage named by its worker's node and host."""
    with open_channel(view.state.entry("orchestrator").grpc, channel) as ch:
        status = orch_grpc.OrchestratorServiceStub(ch).GetPlanStatus(orch_pb.GetPlanStatusRequest(), timeout=30)
    if not status.current.stages:
        raise FailedPrecondition("the orchestrator has no installed route to compare with", reason="NO_INSTALLED_PLAN")
    index = {address: i for i, address in enumerate(view.workers)}
    out = []
    for s in status.current.stages:
        i = index.get(s.worker_address)
        node = node_name(i) if i is not None else s.worker_address
        out.append(InstalledStage(s.stage_index, node, view.hosts[i] if i is not None else s.worker_address,
                                  s.layer_range.layer_start, s.layer_range.layer_end_exclusive))
    return out
