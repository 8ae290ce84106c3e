"""Scale-out: pools scale by replicas behind headless Services, the orchestrator is told the pools'
discovery names (and, with replanOnChange, to re-plan on change), and an HPA per autoscaled pool
scales it on the orchestrator's queued tokens. Rendered with helm, validated by schema."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.route.queued_tokens import NAME as QUEUED_TOKENS
from tests.unit.helm.conftest import run_helm_template
from tests.unit.helm.test_chart_render import CRD_KINDS, FULL, KUBERNETES_VERSION, env_values
from tests.unit.helm.tools import CHART_DIR, kubernetes_validate_module

AUTOSCALED = CHART_DIR / "examples" / "autoscaled-pool.yaml"
CPU, GPU = f"{FULL}-stage-worker-cpu", f"{FULL}-stage-worker-gpu"


def _render(helm, *values, extra=None) -> list[dict]:
    run = run_helm_template(helm, list(values), extra)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def _values(tmp_path, name: str, values: dict):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


def _get(objects, kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _orchestrator_env(objects) -> dict[str, str]:
    (container,) = _get(objects, "Deployment", f"{FULL}-orchestrator")["spec"]["template"]["spec"]["containers"]
    return env_values(container)


@pytest.fixture(scope="module")
def autoscaled(helm):
    return _render(helm, AUTOSCALED)


def test_the_autoscaled_example_lints_and_validates(helm, autoscaled):
    done = subprocess.run([helm, "lint", "--strict", str(CHART_DIR), "-f", str(AUTOSCALED)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    kv = kubernetes_validate_module()
    for obj in autoscaled:
        if obj["kind"] not in CRD_KINDS:
            kv.validate(obj, KUBERNETES_VERSION, strict=True)
    assert [o["kind"] for o in autoscaled].count("HorizontalPodAutoscaler") == 1


@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_a_pool_scales_by_replicas_behind_its_own_headless_service(helm, tmp_path, replicas):
    values = _values(tmp_path, "pools.yaml", {"stageWorker": {"pools": [
        {"name": "cpu", "replicas": replicas}, {"name": "gpu", "replicas": 1}]}})
    objects = _render(helm, values)
    sts = _get(objects, "StatefulSet", CPU)
    assert sts["spec"]["replicas"] == replicas
    service = _get(objects, "Service", CPU)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == CPU
    assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    # The GPU pool's pods do not answer for the CPU pool's name.
    gpu_labels = _get(objects, "StatefulSet", GPU)["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= gpu_labels.items()
    workers = _orchestrator_env(objects)["FORNAX_STAGE_WORKERS"].split(",")
    assert workers == [f"{CPU}-{i}.{CPU}:50051" for i in range(replicas)] + [f"{GPU}-0.{GPU}:50051"]
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]


def test_the_orchestrator_gets_the_pools_discovery_names_in_stage_order(helm, tmp_path, renderings):
    values = _values(tmp_path, "pools.yaml", {"stageWorker": {"pools": [
        {"name": "cpu", "replicas": 2}, {"name": "gpu", "replicas": 1}]}})
    env = _orchestrator_env(_render(helm, values))
    assert env["FORNAX_STAGE_POOLS"] == f"{CPU}:50051,{GPU}:50051"
    assert "FORNAX_REPLAN_ON_CHANGE" not in env  # off unless asked for
    default = _orchestrator_env(renderings["default"].objects)
    assert default["FORNAX_STAGE_POOLS"] == f"{FULL}-stage-worker:50051"


def test_the_orchestrator_reads_the_discovery_environment_the_chart_renders(autoscaled):
    env = _orchestrator_env(autoscaled)
    assert (env["FORNAX_REPLAN_ON_CHANGE"], env["FORNAX_DISCOVERY_INTERVAL_S"], env["FORNAX_REPLAN_SETTLE_S"],
            env["FORNAX_REPLAN_MIN_INTERVAL_S"]) == ("1", "10", "30", "120")
    route = OrchestratorConfig.from_env([], env).route
    assert route.replan_on_change
    assert [pool.format() for pool in route.stage_pools] == [f"{CPU}:50051", f"{GPU}:50051"]
    assert (route.replan_settle_s, route.replan_min_interval_s, route.discovery_interval_s) == (30.0, 120.0, 10.0)
    # Every worker the orchestrator starts with is a pod of one of the pools it watches.
    services = {pool.service for pool in route.stage_pools}
    assert {worker.split(".")[1].rsplit(":")[0] for worker in route.stage_workers} == services


def test_the_hpa_scales_its_pool_on_the_orchestrators_queued_tokens(autoscaled):
    hpa = _get(autoscaled, "HorizontalPodAutoscaler", CPU)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": CPU}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == QUEUED_TOKENS  # what the orchestrator exports
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"service": f"{FULL}-orchestrator"}
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "4096"}
    assert hpa["spec"]["behavior"]["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 600}]
    # The HPA owns the autoscaled pool's replicas; the fixed pool keeps its own.
    assert "replicas" not in _get(autoscaled, "StatefulSet", CPU)["spec"]
    assert _get(autoscaled, "StatefulSet", GPU)["spec"]["replicas"] == 1


def test_every_slot_of_an_autoscaled_pool_has_its_stage_identity(autoscaled):
    cpu = _get(autoscaled, "StatefulSet", CPU)["spec"]["template"]["spec"]
    (tls,) = [v for v in cpu["volumes"] if v["name"] == "tls"]
    secrets = [s["secret"]["name"] for s in tls["projected"]["sources"]]
    assert secrets == [f"{FULL}-stage-{i}-tls" for i in range(6)]  # maxReplicas, not replicas
    gpu = _get(autoscaled, "StatefulSet", GPU)["spec"]["template"]["spec"]
    (container,) = gpu["containers"]
    assert env_values(container)["FORNAX_STAGE_INDEX_OFFSET"] == "6"


def test_autoscaling_without_replan_on_change_is_refused(helm, tmp_path):
    values = _values(tmp_path, "off.yaml", {"orchestrator": {"replanOnChange": {
        "enabled": False, "discoveryIntervalSeconds": 10, "settleSeconds": 30, "minIntervalSeconds": 120}}})
    run = run_helm_template(helm, [AUTOSCALED, values])
    assert run.returncode != 0 and "orchestrator.replanOnChange.enabled" in run.stderr


def test_max_replicas_below_replicas_is_refused(helm, tmp_path):
    values = _values(tmp_path, "small.yaml", {
        "orchestrator": {"replanOnChange": {"enabled": True, "discoveryIntervalSeconds": 10, "settleSeconds": 30,
                                            "minIntervalSeconds": 120}},
        "stageWorker": {"pools": [{"name": "cpu", "replicas": 3, "autoscaling": {"enabled": True, "maxReplicas": 2}}]}})
    run = run_helm_template(helm, [values])
    assert run.returncode != 0 and "maxReplicas" in run.stderr


@pytest.mark.parametrize(("values", "field"), [
    ({"stageWorker": {"pools": [{"name": "cpu", "replicas": 1, "autoscaling": {"enabled": "yes"}}]}}, "enabled"),
    ({"stageWorker": {"pools": [{"name": "cpu", "replicas": 1, "autoscaling": {"maxReplicas": 0}}]}}, "maxReplicas"),
    ({"stageWorker": {"pools": [{"name": "cpu", "replicas": 1, "autoscaling": {"cpu": 80}}]}}, "cpu"),
    ({"orchestrator": {"replanOnChange": {"enabled": True, "settleSeconds": -1}}}, "settleSeconds"),
    ({"orchestrator": {"replanOnChange": {"enabled": True, "discoveryIntervalSeconds": 0, "settleSeconds": 30,
                                          "minIntervalSeconds": 120}}}, "discoveryIntervalSeconds"),
])
def test_the_schema_refuses_bad_scale_out_values(helm, tmp_path, values, field):
    run = run_helm_template(helm, [_values(tmp_path, "bad.yaml", values)])
    assert run.returncode != 0 and field in run.stderr
