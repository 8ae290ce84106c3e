"""No shared volume, install at startup, stage workers from several node pools."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.unit.helm.conftest import run_helm_template
from tests.unit.helm.test_chart_render import CRD_KINDS, FULL, KUBERNETES_VERSION, env_of, env_values
from tests.unit.helm.tools import CHART_DIR, kubernetes_validate_module

POOLS = CHART_DIR / "examples" / "gpu-and-cpu-pools.yaml"


@pytest.fixture(scope="module")
def pools(helm):
    run = run_helm_template(helm, [POOLS])
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def _get(objects, kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _container(workload: dict) -> dict:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def test_the_pools_example_lints_and_validates(helm, pools):
    done = subprocess.run([helm, "lint", "--strict", str(CHART_DIR), "-f", str(POOLS)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    kv = kubernetes_validate_module()
    for obj in pools:
        if obj["kind"] not in CRD_KINDS:
            kv.validate(obj, KUBERNETES_VERSION, strict=True)


def test_each_pool_is_its_own_statefulset_with_its_backend_and_nodes(pools):
    gpu = _get(pools, "StatefulSet", f"{FULL}-stage-worker-gpu")
    cpu = _get(pools, "StatefulSet", f"{FULL}-stage-worker-cpu")
    assert (gpu["spec"]["replicas"], cpu["spec"]["replicas"]) == (2, 1)
    assert gpu["spec"]["template"]["spec"]["nodeSelector"] == {"fornax.dev/accelerator": "nvidia"}
    assert cpu["spec"]["template"]["spec"]["nodeSelector"] == {"fornax.dev/pool": "cpu-highmem"}
    assert "tolerations" not in cpu["spec"]["template"]["spec"]
    assert _container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in _container(cpu)["resources"]["limits"]
    gpu_env, cpu_env = env_values(_container(gpu)), env_values(_container(cpu))
    assert (gpu_env["FORNAX_BACKEND"], gpu_env["FORNAX_DEVICE"]) == ("max", "gpu")
    assert (cpu_env["FORNAX_BACKEND"], cpu_env["FORNAX_DEVICE"]) == ("numpy", "cpu")
    # The CPU pool's pod 0 is stage 2: pools serve consecutive stages in the order listed.
    assert "FORNAX_STAGE_INDEX_OFFSET" not in gpu_env and cpu_env["FORNAX_STAGE_INDEX_OFFSET"] == "2"
    for sts in (gpu, cpu):
        service = _get(pools, "Service", sts["spec"]["serviceName"])
        assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        pool_name = sts["metadata"]["name"].rsplit("-", 1)[1]
        assert sts["spec"]["selector"]["matchLabels"]["fornax.dev/stage-pool"] == pool_name
        assert f".{sts['metadata']['name']}." in env_of(_container(sts))["FORNAX_ADVERTISE_HOST"]["value"]


def test_the_orchestrator_installs_at_startup_across_the_pools_in_order(pools):
    orchestrator = env_values(_container(_get(pools, "Deployment", f"{FULL}-orchestrator")))
    gpu, cpu = f"{FULL}-stage-worker-gpu", f"{FULL}-stage-worker-cpu"
    assert orchestrator["FORNAX_STAGE_WORKERS"].split(",") == [
        f"{gpu}-0.{gpu}:50051", f"{gpu}-1.{gpu}:50051", f"{cpu}-0.{cpu}:50051"]
    assert orchestrator["FORNAX_CHECKPOINT"] == "/var/lib/fornax/checkpoints/deepseek-v2-lite"
    assert orchestrator["FORNAX_BACKEND"] == "worker"
    assert not [j for j in pools if j["kind"] == "Job"]  # nothing left to run by hand


def test_no_volume_is_shared_between_workloads(pools, renderings):
    for objects in [pools, *(r.objects for r in renderings.values())]:
        claims: dict[str, list[str]] = {}
        for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
            for volume in workload["spec"]["template"]["spec"].get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    claims.setdefault(volume["persistentVolumeClaim"]["claimName"], []).append(
                        workload["metadata"]["name"])
        shared = {claim: users for claim, users in claims.items() if len(users) > 1}
        assert shared == {}
        modes = [m for o in objects if o["kind"] == "PersistentVolumeClaim" for m in o["spec"]["accessModes"]]
        assert "ReadWriteMany" not in modes
        checkpoint_users = claims.get("fornax-checkpoints", [])
        assert checkpoint_users in ([], [f"{FULL}-artifact-builder"])


def test_the_schema_refuses_read_write_many(helm, tmp_path):
    path = tmp_path / "rwx.yaml"
    path.write_text(yaml.safe_dump({"artifactBuilder": {"persistence": {"accessMode": "ReadWriteMany"}}}))
    run = run_helm_template(helm, [path])
    assert run.returncode != 0 and "artifactBuilder.persistence.accessMode" in run.stderr


@pytest.mark.parametrize(("pool", "field"), [({"name": "gpu"}, "replicas"),
                                             ({"name": "Bad_Name", "replicas": 1}, "name"),
                                             ({"name": "x", "replicas": 1, "backend": "torch"}, "backend")])
def test_the_schema_refuses_bad_pools(helm, tmp_path, pool, field):
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump({"stageWorker": {"pools": [pool]}}))
    run = run_helm_template(helm, [path])
    assert run.returncode != 0 and field in run.stderr


def test_an_install_at_startup_needs_the_checkpoints_on_the_builder(helm, tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({"model": {"checkpoint": "/var/lib/fornax/checkpoints/m", "boundaryDtype": "bf16"}}))
    run = run_helm_template(helm, [path])
    assert run.returncode != 0 and "checkpoints.existingClaim" in run.stderr
