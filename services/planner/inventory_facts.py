"""The planner's inventory, built from what each stage worker reports about itself.

Memory and CPU come from what the worker's cgroup enforces (its quota in cores, its memory
limit); a worker without such limits shares its host's figures with the other workers that
advertise the same data-plane host. What no worker reports (FLOP/s and bandwidth per core,
link speeds) is a declared constant: a plan built on it is exploratory and labelled so. So is
the runtime's own resident memory held back on each worker's host (`RUNTIME_RESERVE_BYTES`).
When the fleet's registry holds stage and link profiles, the planner plans from those instead
(a profile's measured runtime reserve included, `services.planner.reserve`) and the declared
constants only fill (labelled) gaps.
"""

from __future__ import annotations

from collections import Counter

from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from libs.common.kinds import Backend
from libs.common.proto import BACKEND_FROM_PB, DTYPE_FROM_PB
from libs.profiles import schema
from libs.security.identity import stage_identity
from services.planner.inventory import Inventory, Link, Node
from services.planner.profiles import ProfileRecordInput

# Declared per-core figures for a CPU worker that has no measured capability record yet.
CPU_FLOPS_PER_CORE = 20e9
CPU_BANDWIDTH_BYTES_PER_S = 10e9
# Declared link between workers (about what a raw loopback socket moves).
DECLARED_LINK_BYTES_PER_S = 4e9
DECLARED_LINK_LATENCY_NS = 50_000
DECLARED_LABEL = "declared per-core constants (exploratory fallback)"
MIB = 2**20
# The runtime's own resident memory on a host beside its stage's weights, KV and buffers
# (interpreter, gRPC, backend runtime): a declared estimate, used where no stage profile of the
# host measured it (`services.planner.reserve`).
RUNTIME_RESERVE_BYTES = {Backend.MAX: 512 * MIB, Backend.NUMPY: 512 * MIB}


def node_name(index: int) -> str:
    return f"stage_worker_{index}"


def _host_of(cap: sw_pb.GetCapabilitiesResponse) -> str:
    return cap.data_plane_host or cap.device.name


def _cores(cap: sw_pb.GetCapabilitiesResponse, share: int) -> float:
    if cap.device.cpu_quota_cores > 0:
        return cap.device.cpu_quota_cores
    return max(1.0, cap.device.cpu_count / share)


def _memory(cap: sw_pb.GetCapabilitiesResponse, share: int) -> int:
    available = cap.device.memory_available_bytes // share
    limit = cap.device.memory_limit_bytes
    return min(limit, available) if limit and available else (limit or available)


def _dtypes(cap: sw_pb.GetCapabilitiesResponse) -> tuple:
    return tuple(DTYPE_FROM_PB[d] for d in cap.supported_dtypes if d in DTYPE_FROM_PB)


def hosts_from_profiles(capabilities: list[sw_pb.GetCapabilitiesResponse],
                        records: list[ProfileRecordInput]) -> tuple[str, ...]:
    """The fleet host of each worker (stage order): the host of the stage profile that worker
    measured, matched by its fleet identity (a plaintext worker reports none: the identity of its
    stage index stands in), else its node name."""
    by_worker: dict[str, str] = {}
    for record in records:
        if record.record_type != "measurement" or record.label(schema.LABEL_PROFILE) != "stage":
            continue
        try:
            profile = schema.stage_profile_from_json(record.blob)
        except schema.ProfileFormatError:
            continue  # the planner names a malformed record when it parses the set
        by_worker.setdefault(profile.worker, profile.host.host)
    return tuple(by_worker.get(cap.identity or stage_identity(i).uri, node_name(i))
                 for i, cap in enumerate(capabilities))


def inventory_from(capabilities: list[sw_pb.GetCapabilitiesResponse], hosts: tuple[str, ...] = ()) -> Inventory:
    """One node per worker, in stage-worker order; `hosts` names each worker's fleet host."""
    sharing = Counter(_host_of(cap) for cap in capabilities)
    nodes = tuple(
        Node(
            name=node_name(index),
            backend=BACKEND_FROM_PB[cap.backend],
            memory_bytes=_memory(cap, 1 if cap.device.memory_limit_bytes else sharing[_host_of(cap)]),
            compute_flops=CPU_FLOPS_PER_CORE * _cores(cap, sharing[_host_of(cap)]),
            memory_bandwidth_bytes_per_s=CPU_BANDWIDTH_BYTES_PER_S,
            dtypes=_dtypes(cap),
            operations=tuple(cap.supported_operations),
            build=cap.backend_build,
            host=hosts[index] if hosts else "",
            weight_formats=tuple(cap.weight_formats),
            reserve_bytes=RUNTIME_RESERVE_BYTES.get(BACKEND_FROM_PB[cap.backend], 0),
            max_activations=cap.max_activations,
        )
        for index, cap in enumerate(capabilities)
    )
    links = tuple(Link(a.name, b.name, DECLARED_LINK_BYTES_PER_S, DECLARED_LINK_LATENCY_NS)
                  for i, a in enumerate(nodes) for b in nodes[i + 1:])
    return Inventory(nodes=nodes, links=links)


def _activations(cap: sw_pb.GetCapabilitiesResponse) -> str:
    return f", {cap.max_activations} activations" if cap.max_activations else ""


def describe_facts(capabilities: list[sw_pb.GetCapabilitiesResponse], profiled: bool = False) -> str:
    """One line per worker of the facts the inventory used, for the install log. `profiled`: the
    plan's compute comes from the registry's stage profiles, declared constants only fill gaps."""
    return "; ".join(
        f"{node_name(i)}@{_host_of(c)} {BACKEND_FROM_PB.get(c.backend, 'unknown')} "
        f"({c.backend_build}{_activations(c)}) quota {c.device.cpu_quota_cores:g} cores "
        f"cpuset {c.device.cpuset or '?'} memory limit {c.device.memory_limit_bytes or 'none'}"
        for i, c in enumerate(capabilities)
    ) + ("; compute and runtime reserve from stage profiles (physical), gaps from " if profiled
         else "; compute and runtime reserve from ") + DECLARED_LABEL
