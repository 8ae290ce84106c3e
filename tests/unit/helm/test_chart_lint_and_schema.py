"""`helm lint --strict` passes, and values.schema.json turns bad values away before rendering."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.unit.helm.conftest import VALUES_DIR, run_helm_template
from tests.unit.helm.tools import CHART_DIR


@pytest.mark.parametrize("values_file", [None, "production.yaml", "three-stages.yaml", "external-worker.yaml"])
def test_helm_lint_strict_passes(helm, values_file):
    cmd = [helm, "lint", "--strict", str(CHART_DIR)]
    if values_file:
        cmd += ["-f", str(VALUES_DIR / values_file)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


# Each case: values that must be refused, and the field path the error must name.
REJECTED = {
    "unknown-backend": ({"stageWorker": {"backend": "torch"}}, "stageWorker.backend"),
    "unknown-device": ({"stageWorker": {"device": "tpu"}}, "stageWorker.device"),
    "no-stages": ({"stageWorker": {"stages": 0}}, "stageWorker.stages"),
    "too-many-stages": ({"stageWorker": {"stages": 65}}, "stageWorker.stages"),
    "port-zero": ({"ports": {"grpc": 0}}, "ports.grpc"),
    "port-too-high": ({"ports": {"dataPlane": 70000}}, "ports.dataPlane"),
    "port-as-string": ({"ports": {"metrics": "9464"}}, "ports.metrics"),
    "two-orchestrators": ({"orchestrator": {"replicas": 2}}, "orchestrator.replicas"),
    "planner-replicas-zero": ({"planner": {"replicas": 0}}, "planner.replicas"),
    "unknown-top-level-key": ({"stageWorkers": {"stages": 2}}, "stageWorkers"),
    "unknown-nested-key": ({"planner": {"extraEnv": []}}, "extraEnv"),
    "root-user": ({"security": {"runAsUser": 0}}, "security.runAsUser"),
    "cert-manager-without-issuer": ({"tls": {"certManager": {"enabled": True}}}, "tls.certManager.issuerRef.name"),
    "unknown-tls-key": ({"tls": {"grpc": {"enabled": True}}}, "grpc"),
    "tiny-body-cap": ({"orchestrator": {"limits": {"httpMaxBodyBytes": 10}}}, "orchestrator.limits.httpMaxBodyBytes"),
    "zero-prefill-chunk": ({"orchestrator": {"scheduling": {"minPrefillChunkTokens": 0}}},
                           "orchestrator.scheduling.minPrefillChunkTokens"),
    "bad-log-level": ({"logLevel": "verbose"}, "logLevel"),
    "bad-otel-endpoint": ({"otel": {"endpoint": "collector:4317"}}, "otel.endpoint"),
    "negative-kv-limit": ({"stageWorker": {"kvLimitBytes": -1}}, "stageWorker.kvLimitBytes"),
    "external-worker-without-port": ({"stageWorker": {"external": [{"grpcAddress": "mac.lan"}]}},
                                     "stageWorker.external.0.grpcAddress"),
    "bad-access-mode": ({"evidenceRegistry": {"persistence": {"accessMode": "ReadOnlyMany"}}},
                        "evidenceRegistry.persistence.accessMode"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_schema_rejects_bad_values(helm, tmp_path, case):
    values, field = REJECTED[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(values))
    run = run_helm_template(helm, [path])
    assert run.returncode != 0, f"{case} was accepted"
    assert "values don't meet the specifications of the schema" in run.stderr
    assert field in run.stderr, run.stderr


def test_schema_accepts_the_shipped_values_files(helm):
    for path in sorted(VALUES_DIR.glob("*.yaml")):
        run = run_helm_template(helm, [path])
        assert run.returncode == 0, f"{path.name}: {run.stderr}"
