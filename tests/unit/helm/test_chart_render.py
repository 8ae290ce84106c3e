"""Renders the chart with several values files and checks the objects a cluster would get."""

from __future__ import annotations

import copy
import json

import pytest

from tests.unit.helm.conftest import NAMESPACE, RELEASE, Rendering
from tests.unit.helm.tools import kubernetes_validate_module

KUBERNETES_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "Certificate"}
FULL = f"{RELEASE}-fornax"
DEPLOYMENTS = ("orchestrator", "planner", "evidence-registry", "artifact-builder")
SCENARIOS = ("default", "production", "three-stages", "external-worker")

COMMON_ENV = {"FORNAX_HOST", "FORNAX_GRPC_PORT", "FORNAX_METRICS_PORT", "FORNAX_LOG_LEVEL",
              "FORNAX_GRACE_PERIOD_S", "OTEL_EXPORTER_OTLP_ENDPOINT", "FORNAX_HEALTH_PORT", "FORNAX_STATE_DIR",
              "FORNAX_TLS_CA", "FORNAX_TLS_CERT", "FORNAX_TLS_KEY", "FORNAX_INSECURE"}
# The service configuration contract: the only variables each service reads.
CONTRACT_ENV = {
    "orchestrator": {"FORNAX_HTTP_PORT", "FORNAX_API_KEY", "FORNAX_PLANNER_ADDR",
                     "FORNAX_ARTIFACT_BUILDER_ADDR", "FORNAX_STAGE_WORKERS", "FORNAX_STATE_DIR",
                     "FORNAX_CHECKPOINT", "FORNAX_BACKEND", "FORNAX_BOUNDARY_DTYPE", "FORNAX_HTTP_TLS_CERT",
                     "FORNAX_HTTP_TLS_KEY", "FORNAX_HTTP_INSECURE", "FORNAX_HTTP_MAX_BODY_BYTES",
                     "FORNAX_MAX_PROMPT_TOKENS", "FORNAX_MAX_TOKENS_CAP", "FORNAX_MAX_TOKENS_PER_STEP",
                     "FORNAX_MIN_PREFILL_CHUNK_TOKENS", "FORNAX_STAGE_POOLS", "FORNAX_REPLAN_ON_CHANGE",
                     "FORNAX_DISCOVERY_INTERVAL_S", "FORNAX_REPLAN_SETTLE_S", "FORNAX_REPLAN_MIN_INTERVAL_S"},
    "planner": {"FORNAX_REGISTRY_ADDR"},
    "evidence-registry": {"FORNAX_REGISTRY_DB", "FORNAX_REGISTRY_BLOB_DIR"},
    "artifact-builder": {"FORNAX_ARTIFACT_STORE", "FORNAX_REGISTRY_ADDR", "FORNAX_READ_ROOTS"},
    "stage-worker": {"FORNAX_STAGE_INDEX", "FORNAX_DATA_PLANE_PORT", "FORNAX_OVERLAP_DATA_PLANE_PORT",
                     "FORNAX_MEMORY_LIMIT_BYTES", "FORNAX_BACKEND", "FORNAX_DEVICE",
                     "FORNAX_COMPILE_CACHE_DIR", "FORNAX_KV_LIMIT_BYTES", "MODULAR_TELEMETRY_ENABLED",
                     "POD_NAME", "FORNAX_ADVERTISE_HOST", "FORNAX_STATE_DIR", "FORNAX_STAGE_INDEX_OFFSET",
                     "FORNAX_MAX_ACTIVATIONS"},
}


def workload(r: Rendering, component: str) -> dict:
    kind = "StatefulSet" if component == "stage-worker" else "Deployment"
    return r.get(kind, f"{FULL}-{component}")


def container(r: Rendering, component: str) -> dict:
    containers = workload(r, component)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c["env"]}


def env_values(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


ALL_COMPONENTS = DEPLOYMENTS + ("stage-worker",)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_validates_against_kubernetes_schemas(renderings, scenario):
    kv = kubernetes_validate_module()
    for obj in renderings[scenario].objects:
        if obj["kind"] in CRD_KINDS:
            continue
        kv.validate(obj, KUBERNETES_VERSION, strict=True)


def test_schema_validation_rejects_a_broken_object(renderings):
    kv = kubernetes_validate_module()
    broken = copy.deepcopy(workload(renderings["default"], "planner"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(workload(renderings["default"], "planner"))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["dropAll"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSION, strict=True)


def test_default_rendering_has_the_expected_objects(renderings):
    names = {(o["kind"], o["metadata"]["name"]) for o in renderings["default"].objects}
    expected = {("Deployment", f"{FULL}-{c}") for c in DEPLOYMENTS}
    expected |= {("Service", f"{FULL}-{c}") for c in ALL_COMPONENTS}
    expected |= {("StatefulSet", f"{FULL}-stage-worker"), ("ServiceAccount", FULL),
                 ("PersistentVolumeClaim", f"{FULL}-evidence-registry"),
                 ("PersistentVolumeClaim", f"{FULL}-artifact-builder"),
                 ("ConfigMap", f"{FULL}-dashboards")}
    expected |= {("NetworkPolicy", f"{FULL}-{c}") for c in ALL_COMPONENTS}
    assert names == expected


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ports_and_native_grpc_probes(renderings, scenario):
    r = renderings[scenario]
    for component in ALL_COMPONENTS:
        c = container(r, component)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == 50051 and ports["metrics"] == 9464 and ports["health"] == 50052
        # Probes use the plaintext health-only port: the gRPC port wants a client certificate.
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["grpc"] == {"port": 50052}
        env = env_values(c)
        assert env["FORNAX_HOST"] == "0.0.0.0"
        assert env["FORNAX_GRPC_PORT"] == "50051" and env["FORNAX_METRICS_PORT"] == "9464"
    assert {p["name"]: p["containerPort"] for p in container(r, "orchestrator")["ports"]}["http"] == 8000
    worker = container(r, "stage-worker")
    assert {p["name"]: p["containerPort"] for p in worker["ports"]}["fnx2"] == 7070
    assert worker["startupProbe"]["grpc"] == {"port": 50052}
    assert env_values(worker)["FORNAX_DATA_PLANE_PORT"] == "7070"
    # A plan generation loaded beside the serving one listens on its own port.
    assert {p["name"]: p["containerPort"] for p in worker["ports"]}["fnx2-overlap"] == 7071
    assert env_values(worker)["FORNAX_OVERLAP_DATA_PLANE_PORT"] == "7071"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_environment_follows_the_service_contract(renderings, scenario):
    r = renderings[scenario]
    for component in ALL_COMPONENTS:
        names = set(env_of(container(r, component)))
        assert names <= COMMON_ENV | CONTRACT_ENV[component], names - COMMON_ENV - CONTRACT_ENV[component]
    registry = f"{FULL}-evidence-registry:50051"
    assert env_values(container(r, "planner"))["FORNAX_REGISTRY_ADDR"] == registry
    assert env_values(container(r, "artifact-builder"))["FORNAX_REGISTRY_ADDR"] == registry
    orch = env_values(container(r, "orchestrator"))
    assert orch["FORNAX_PLANNER_ADDR"] == f"{FULL}-planner:50051"
    assert orch["FORNAX_ARTIFACT_BUILDER_ADDR"] == f"{FULL}-artifact-builder:50051"
    assert orch["FORNAX_HTTP_PORT"] == "8000"


def test_stage_workers_have_stable_ordered_addresses(renderings):
    r = renderings["three-stages"]
    sts = workload(r, "stage-worker")
    headless = r.get("Service", f"{FULL}-stage-worker")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {"grpc": 50051, "fnx2": 7070,
                                                                         "fnx2-overlap": 7071,
                                                                         "metrics": 9464, "health": 50052}
    workers = env_values(container(r, "orchestrator"))["FORNAX_STAGE_WORKERS"].split(",")
    sts_name = f"{FULL}-stage-worker"
    assert workers == [f"{sts_name}-{i}.{sts_name}:50051" for i in range(3)]
    index = env_of(container(r, "stage-worker"))["FORNAX_STAGE_INDEX"]
    assert index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    env = env_values(container(r, "stage-worker"))
    assert env["FORNAX_BACKEND"] == "numpy" and env["FORNAX_DEVICE"] == "cpu"
    assert "FORNAX_KV_LIMIT_BYTES" not in env


def test_external_workers_follow_the_in_cluster_stages(renderings):
    r = renderings["external-worker"]
    sts_name = f"{FULL}-stage-worker"
    assert workload(r, "stage-worker")["spec"]["replicas"] == 2
    workers = env_values(container(r, "orchestrator"))["FORNAX_STAGE_WORKERS"].split(",")
    assert workers == [f"{sts_name}-0.{sts_name}:50051", f"{sts_name}-1.{sts_name}:50051", "mac-studio.lan:50051"]


def test_production_values_reach_the_pods(renderings):
    r = renderings["production"]
    for component in ALL_COMPONENTS:
        c = container(r, component)
        assert env_values(c)["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4317"
        assert c["image"] == f"registry.example.internal/fornax/fornax-{component}:0.1.0"
    key = env_of(container(r, "orchestrator"))["FORNAX_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "fornax-api-key", "key": "token"}
    assert "value" not in key
    worker = env_values(container(r, "stage-worker"))
    assert worker["FORNAX_BACKEND"] == "max" and worker["FORNAX_DEVICE"] == "gpu"
    assert worker["FORNAX_KV_LIMIT_BYTES"] == "34359738368"
    assert len(env_values(container(r, "orchestrator"))["FORNAX_STAGE_WORKERS"].split(",")) == 4
    templates = workload(r, "stage-worker")["spec"]["volumeClaimTemplates"]
    assert [t["metadata"]["name"] for t in templates] == ["compile-cache"]


def test_default_has_tls_on_and_no_api_key_or_otel(renderings):
    r = renderings["default"]
    for component in ALL_COMPONENTS:
        c = container(r, component)
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env_of(c)
        assert "FORNAX_API_KEY" not in env_of(c)
        assert "FORNAX_INSECURE" not in env_of(c)
        assert env_values(c)["FORNAX_TLS_CERT"].startswith("/etc/fornax/tls/")
        assert c["image"] == f"localhost/fornax-{component}:0.1.0"
    assert r.kinds("Certificate") == []


def volumes_by_name(r: Rendering, component: str) -> dict[str, dict]:
    return {v["name"]: v for v in workload(r, component)["spec"]["template"]["spec"]["volumes"]}


def mounts_by_name(r: Rendering, component: str) -> dict[str, dict]:
    return {m["name"]: m for m in container(r, component)["volumeMounts"]}


def test_every_identity_gets_its_own_tls_secret_read_only(renderings):
    r = renderings["default"]
    for component in DEPLOYMENTS:
        vols, mounts = volumes_by_name(r, component), mounts_by_name(r, component)
        assert vols["tls"]["secret"]["secretName"] == f"{FULL}-{component}-tls"
        assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/fornax/tls", "readOnly": True}
        env = env_values(container(r, component))
        assert (env["FORNAX_TLS_CA"], env["FORNAX_TLS_CERT"], env["FORNAX_TLS_KEY"]) == (
            "/etc/fornax/tls/ca.crt", "/etc/fornax/tls/tls.crt", "/etc/fornax/tls/tls.key")
    # A StatefulSet cannot mount a Secret per pod: every stage Secret is projected under
    # stage-<i>/ and each worker picks its own by index.
    sources = volumes_by_name(r, "stage-worker")["tls"]["projected"]["sources"]
    assert [src["secret"]["name"] for src in sources] == [f"{FULL}-stage-{i}-tls" for i in range(2)]
    assert {item["path"] for item in sources[1]["secret"]["items"]} == {
        "stage-1/ca.crt", "stage-1/tls.crt", "stage-1/tls.key"}
    names = [e["name"] for e in container(r, "stage-worker")["env"]]
    assert names.index("FORNAX_STAGE_INDEX") < names.index("FORNAX_TLS_CERT")
    cert = env_values(container(r, "stage-worker"))["FORNAX_TLS_CERT"]
    assert cert == "/etc/fornax/tls/stage-$(FORNAX_STAGE_INDEX)/tls.crt"


def test_cert_manager_issues_one_certificate_per_identity_with_its_role(renderings):
    r = renderings["production"]
    certs = {c["metadata"]["name"]: c["spec"] for c in r.kinds("Certificate")}
    expected = {f"fornax-{c}-tls" for c in DEPLOYMENTS} | {f"fornax-stage-{i}-tls" for i in range(4)}
    assert set(certs) == expected | {"fornax-operator-tls"}
    assert certs["fornax-planner-tls"]["uris"] == ["spiffe://fornax/service/planner"]
    assert certs["fornax-stage-3-tls"]["uris"] == ["spiffe://fornax/stage/stage-3"]
    assert f"{FULL}-stage-worker-3.{FULL}-stage-worker.{NAMESPACE}.svc" in certs["fornax-stage-3-tls"]["dnsNames"]
    assert certs["fornax-operator-tls"]["uris"] == ["spiffe://fornax/operator/admin"]
    assert "server auth" not in certs["fornax-operator-tls"]["usages"]
    for spec in certs.values():
        assert spec["secretName"] in certs and spec["issuerRef"]["name"] == "fornax-ca"
        assert spec["privateKey"]["rotationPolicy"] == "Always"
    orchestrator = env_values(container(r, "orchestrator"))
    assert orchestrator["FORNAX_HTTP_TLS_CERT"] == "/etc/fornax/http-tls/tls.crt"
    assert volumes_by_name(r, "orchestrator")["http-tls"]["secret"]["secretName"] == "fornax-api-tls"
    assert (orchestrator["FORNAX_MAX_PROMPT_TOKENS"], orchestrator["FORNAX_MAX_TOKENS_CAP"]) == ("8192", "2048")
    step_budget = (orchestrator["FORNAX_MAX_TOKENS_PER_STEP"], orchestrator["FORNAX_MIN_PREFILL_CHUNK_TOKENS"])
    assert step_budget == ("512", "32")


def _ingress_rules(r: Rendering, component: str) -> dict[str, list]:
    policy = r.get("NetworkPolicy", f"{FULL}-{component}")
    rules = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            rules[port["port"]] = rule.get("from")
    return rules


def _components(peers: list) -> set[str]:
    return {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers if "podSelector" in p}


def test_network_policies_admit_only_the_planned_callers(renderings):
    r = renderings["production"]
    stage = _ingress_rules(r, "stage-worker")
    assert _components(stage["grpc"]) == {"orchestrator"}
    assert _components(stage["fnx2"]) == {"stage-worker", "orchestrator"}
    assert {"ipBlock": {"cidr": "192.168.50.0/24"}} in stage["fnx2"]
    assert stage["fnx2-overlap"] == stage["fnx2"]
    assert stage["health"] is None and stage["metrics"] is None
    assert _components(_ingress_rules(r, "planner")["grpc"]) == {"orchestrator"}
    assert _components(_ingress_rules(r, "artifact-builder")["grpc"]) == {"orchestrator"}
    assert _components(_ingress_rules(r, "evidence-registry")["grpc"]) == {
        "orchestrator", "planner", "artifact-builder", "stage-worker"}
    ops = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "fornax-ops"}}}
    assert ops in _ingress_rules(r, "planner")["grpc"]
    assert _ingress_rules(r, "orchestrator")["http"] is None


def test_tls_off_is_explicit_in_every_pod(helm, tmp_path):
    from tests.unit.helm.conftest import render

    values = tmp_path / "insecure.yaml"
    values.write_text("tls:\n  enabled: false\n  mountPath: /etc/fornax/tls\n  secretPrefix: ''\n"
                      "  certManager: {enabled: false, issuerRef: {name: '', kind: Issuer, group: cert-manager.io},"
                      " duration: 2160h, renewBefore: 360h, operatorCertificate: false}\n")
    r = render(helm, [values])
    for component in ALL_COMPONENTS:
        env = env_values(container(r, component))
        assert env["FORNAX_INSECURE"] == "1" and "FORNAX_TLS_CERT" not in env
        assert "tls" not in volumes_by_name(r, component)
    assert env_values(container(r, "orchestrator"))["FORNAX_HTTP_INSECURE"] == "1"


def test_state_lives_on_persistent_volume_claims(renderings):
    r = renderings["default"]
    registry_env = env_values(container(r, "evidence-registry"))
    data_mount = mounts_by_name(r, "evidence-registry")["data"]["mountPath"]
    assert registry_env["FORNAX_REGISTRY_DB"].startswith(data_mount + "/")
    assert registry_env["FORNAX_REGISTRY_BLOB_DIR"].startswith(data_mount + "/")
    claim = volumes_by_name(r, "evidence-registry")["data"]["persistentVolumeClaim"]["claimName"]
    assert r.get("PersistentVolumeClaim", claim)["spec"]["resources"]["requests"]["storage"] == "5Gi"
    store = env_values(container(r, "artifact-builder"))["FORNAX_ARTIFACT_STORE"]
    assert mounts_by_name(r, "artifact-builder")["artifacts"]["mountPath"] == store
    claim = volumes_by_name(r, "artifact-builder")["artifacts"]["persistentVolumeClaim"]["claimName"]
    r.get("PersistentVolumeClaim", claim)
    # Stage workers fetch artifacts over gRPC into their own emptyDir; they mount no claim.
    worker_volumes = volumes_by_name(r, "stage-worker")
    assert not [v for v in worker_volumes.values() if "persistentVolumeClaim" in v]
    state = env_values(container(r, "stage-worker"))["FORNAX_STATE_DIR"]
    assert mounts_by_name(r, "stage-worker")["state"]["mountPath"] == state and "emptyDir" in worker_volumes["state"]
    for component in ("evidence-registry", "artifact-builder"):
        assert workload(r, component)["spec"]["strategy"] == {"type": "Recreate"}
        assert workload(r, component)["spec"]["replicas"] == 1


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pods_run_non_root_with_nothing_extra(renderings, scenario):
    r = renderings[scenario]
    for component in ALL_COMPONENTS:
        pod = workload(r, component)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        sc = container(r, component)["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        resources = container(r, component)["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_labels_and_selectors_tie_each_service_to_one_workload(renderings, scenario):
    r = renderings[scenario]
    for obj in r.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/part-of"] == "fornax"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    for component in ALL_COMPONENTS:
        w = workload(r, component)
        pod_labels = w["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["app.kubernetes.io/component"] == component
        assert w["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        selector = r.get("Service", f"{FULL}-{component}")["spec"]["selector"]
        selected = [c for c in ALL_COMPONENTS
                    if selector.items() <= workload(r, c)["spec"]["template"]["metadata"]["labels"].items()]
        assert selected == [component]


def test_service_monitor_renders_only_when_enabled(renderings):
    assert renderings["default"].kinds("ServiceMonitor") == []
    (sm,) = renderings["production"].kinds("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    selector = sm["spec"]["selector"]["matchLabels"]
    scraped = [s for s in renderings["production"].kinds("Service")
               if selector.items() <= s["metadata"]["labels"].items()]
    assert sorted(s["metadata"]["labels"]["app.kubernetes.io/component"] for s in scraped) == sorted(ALL_COMPONENTS)
    for service in scraped:
        assert "metrics" in {p["name"] for p in service["spec"]["ports"]}


def test_dashboards_ship_in_a_labelled_config_map(renderings):
    cm = renderings["production"].get("ConfigMap", f"{FULL}-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Fornax"}
    dashboard = json.loads(cm["data"]["fornax-fleet.json"])
    assert dashboard["uid"] == "fornax-fleet"
    assert renderings["three-stages"].kinds("ConfigMap") == []


def test_stage_workers_advertise_their_stable_dns_name(renderings):
    env = env_of(container(renderings["default"], "stage-worker"))
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    advertised = env["FORNAX_ADVERTISE_HOST"]["value"]
    assert advertised.startswith("$(POD_NAME).") and advertised.endswith(".svc")
    assert f".{FULL}-stage-worker." in advertised


def test_compile_cache_is_seeded_from_the_image_without_overwriting(renderings):
    for scenario in ("default", "production"):
        pod = workload(renderings[scenario], "stage-worker")["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        worker = container(renderings[scenario], "stage-worker")
        assert init["name"] == "seed-compile-cache" and init["image"] == worker["image"]
        script = init["command"][-1]
        assert "cp -Rn /opt/fornax/compile-cache-seed/. /var/cache/fornax/compile/" in script
        assert init["volumeMounts"] == [{"name": "compile-cache", "mountPath": "/var/cache/fornax/compile"}]
        assert env_values(worker)["FORNAX_COMPILE_CACHE_DIR"] == "/var/cache/fornax/compile"
        sc = init["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    # with persistence the seeded cache lives on the claim, so a pod restart keeps every graph
    templates = workload(renderings["production"], "stage-worker")["spec"]["volumeClaimTemplates"]
    assert [t["metadata"]["name"] for t in templates] == ["compile-cache"]


def test_csi_driver_gives_every_stage_pod_its_own_key(helm, tmp_path):
    from tests.unit.helm.conftest import VALUES_DIR, render

    csi = tmp_path / "csi.yaml"
    csi.write_text("tls:\n  certManager:\n    csi:\n      enabled: true\n")
    r = render(helm, [VALUES_DIR / "production.yaml", csi])
    kv = kubernetes_validate_module()
    for obj in r.objects:
        if obj["kind"] not in CRD_KINDS:
            kv.validate(obj, KUBERNETES_VERSION, strict=True)
    volume = volumes_by_name(r, "stage-worker")["tls"]
    assert "projected" not in volume and "secret" not in volume
    attributes = volume["csi"]["volumeAttributes"]
    assert volume["csi"]["driver"] == "csi.cert-manager.io" and volume["csi"]["readOnly"] is True
    assert attributes["csi.cert-manager.io/uri-sans"] == "spiffe://fornax/stage/${POD_NAME}"
    assert f"${{POD_NAME}}.{FULL}-stage-worker.{NAMESPACE}.svc" in attributes["csi.cert-manager.io/dns-names"]
    assert attributes["csi.cert-manager.io/issuer-name"] == "fornax-ca"
    assert attributes["csi.cert-manager.io/issuer-kind"] == "ClusterIssuer"
    assert "server auth" in attributes["csi.cert-manager.io/key-usages"]
    env = env_values(container(r, "stage-worker"))
    assert (env["FORNAX_TLS_CA"], env["FORNAX_TLS_CERT"], env["FORNAX_TLS_KEY"]) == (
        "/etc/fornax/tls/ca.crt", "/etc/fornax/tls/tls.crt", "/etc/fornax/tls/tls.key")
    # No stage Secrets are issued any more; the services and the operator keep theirs.
    certs = {c["metadata"]["name"] for c in r.kinds("Certificate")}
    assert certs == {f"fornax-{c}-tls" for c in DEPLOYMENTS} | {"fornax-operator-tls"}
    # The services still mount their own Secret.
    assert volumes_by_name(r, "planner")["tls"]["secret"]["secretName"] == "fornax-planner-tls"


def test_csi_needs_cert_manager_and_rejects_unknown_settings(helm, tmp_path):
    from tests.unit.helm.conftest import run_helm_template

    typo = tmp_path / "typo.yaml"
    typo.write_text("tls:\n  certManager:\n    csi:\n      enabled: true\n      driver: other\n")
    assert run_helm_template(helm, [typo]).returncode != 0
    without = tmp_path / "without.yaml"
    without.write_text("tls:\n  certManager:\n    csi:\n      enabled: true\n")
    refused = run_helm_template(helm, [without])
    assert refused.returncode != 0 and "needs tls.enabled and tls.certManager.enabled" in refused.stderr
