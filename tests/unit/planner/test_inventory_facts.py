"""The planner inventory follows what each worker's cgroup enforces."""

from __future__ import annotations

from dataclasses import replace

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from services.planner.inventory_facts import CPU_FLOPS_PER_CORE, RUNTIME_RESERVE_BYTES, describe_facts, inventory_from

GIB = 1 << 30


def _cap(host: str, backend=common_pb2.BACKEND_NUMPY, quota=0.0, limit=0, cpus=2, available=8 * GIB):
    return sw_pb.GetCapabilitiesResponse(
        backend=backend, backend_build="numpy 2", data_plane_host=host,
        supported_dtypes=[common_pb2.ELEMENT_TYPE_FP32],
        device=sw_pb.DeviceInfo(kind="cpu", name="Same CPU", cpu_count=cpus, memory_available_bytes=available,
                                cpu_quota_cores=quota, cpuset="0-1", memory_limit_bytes=limit))


def test_limited_workers_get_their_own_quota_and_memory_even_with_one_cpu_model():
    inventory = inventory_from([_cap("198.18.0.10", common_pb2.BACKEND_MAX, 1.5, 6 * GIB),
                                _cap("198.18.0.11", quota=0.5, limit=2 * GIB)])
    alpha, beta = inventory.nodes
    assert (alpha.backend, alpha.compute_flops, alpha.memory_bytes) == ("max", 1.5 * CPU_FLOPS_PER_CORE, 6 * GIB)
    assert (beta.backend, beta.compute_flops, beta.memory_bytes) == ("numpy", 0.5 * CPU_FLOPS_PER_CORE, 2 * GIB)
    assert beta.dtypes == ("fp32",)


def test_unlimited_workers_on_one_host_share_it():
    inventory = inventory_from([_cap("127.0.0.1"), _cap("127.0.0.1")])
    assert [n.memory_bytes for n in inventory.nodes] == [4 * GIB, 4 * GIB]
    assert [n.compute_flops for n in inventory.nodes] == [CPU_FLOPS_PER_CORE] * 2


def test_a_memory_limit_above_what_is_available_is_capped():
    (node,) = inventory_from([_cap("h", limit=64 * GIB, available=8 * GIB)]).nodes
    assert node.memory_bytes == 8 * GIB


def test_the_description_names_the_facts_and_labels_the_constants():
    line = describe_facts([_cap("198.18.0.11", quota=0.5, limit=2 * GIB)])
    assert "198.18.0.11" in line and "quota 0.5 cores" in line and str(2 * GIB) in line
    assert "exploratory" in line
    profiled = describe_facts([_cap("198.18.0.11", quota=0.5, limit=2 * GIB)], profiled=True)
    assert "compute and runtime reserve from stage profiles (physical), gaps from declared" in profiled


def test_each_worker_takes_the_host_of_the_stage_profile_it_measured():
    from services.planner.inventory_facts import hosts_from_profiles
    from tests.unit.planner.profile_factories import link_profile, link_record, stage_profile, stage_record

    alpha, beta = _cap("198.18.0.10"), _cap("198.18.0.11")
    alpha.identity, beta.identity = "spiffe://fornax/stage/alpha", "spiffe://fornax/stage/elsewhere"
    records = [stage_record(stage_profile("alpha", "sha256:m")), link_record(link_profile("alpha", "beta"))]
    hosts = hosts_from_profiles([alpha, beta], records)
    assert hosts == ("alpha", "stage_worker_1")  # beta measured nothing under its identity
    assert [n.host for n in inventory_from([alpha, beta], hosts).nodes] == ["alpha", "stage_worker_1"]
    plaintext = _cap("198.18.0.12")  # no identity: the one of its stage index (spiffe://fornax/stage/stage-0)
    gamma = stage_record(replace(stage_profile("gamma", "sha256:m"), worker="spiffe://fornax/stage/stage-0"))
    assert hosts_from_profiles([plaintext], [gamma]) == ("gamma",)


def test_running_workers_hold_back_the_declared_runtime_reserve_of_their_backend():
    nodes = inventory_from([_cap("198.18.0.11", quota=0.5, limit=2 * GIB)]).nodes
    assert nodes[0].reserve_bytes == RUNTIME_RESERVE_BYTES[nodes[0].backend] == 512 * 2**20
