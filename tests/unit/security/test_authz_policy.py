from libs.security.authz import ORCHESTRATOR, Reason, RefusalKind, decide
from libs.security.identity import Identity, Role

STAGE = "/fornax.stage_worker.v1.StageWorkerService/"
ORCH = "/fornax.orchestrator.v1.OrchestratorService/"
OPERATOR = Identity(Role.OPERATOR, "admin")
CLIENT = Identity(Role.CLIENT, "app")


def test_client_role_may_generate_but_not_unload():
    assert decide(ORCH + "Generate", CLIENT) is None
    refusal = decide(STAGE + "UnloadStage", CLIENT)
    assert refusal.kind is RefusalKind.PERMISSION_DENIED and refusal.reason is Reason.ROLE_NOT_ALLOWED


def test_stage_control_is_for_operators_and_the_orchestrator_only():
    assert decide(STAGE + "LoadStage", OPERATOR) is None
    assert decide(STAGE + "LoadStage", ORCHESTRATOR) is None
    assert decide(STAGE + "LoadStage", Identity(Role.SERVICE, "planner")).reason is Reason.ROLE_NOT_ALLOWED
    assert decide(STAGE + "LoadStage", Identity(Role.STAGE, "stage-0")).reason is Reason.ROLE_NOT_ALLOWED


def test_install_needs_the_operator_role_even_for_services():
    assert decide(ORCH + "InstallPlan", ORCHESTRATOR).reason is Reason.ROLE_NOT_ALLOWED
    assert decide(ORCH + "InstallPlan", OPERATOR) is None


def test_api_key_grants_serving_only():
    service = Identity(Role.SERVICE, "planner")
    assert decide(ORCH + "Generate", service).reason is Reason.ROLE_NOT_ALLOWED
    assert decide(ORCH + "Generate", service, api_key_ok=True) is None
    assert decide(ORCH + "DrainPlan", service, api_key_ok=True).reason is Reason.ROLE_NOT_ALLOWED


def test_no_identity_is_unauthenticated_and_health_is_open():
    refusal = decide(ORCH + "Generate", None)
    assert refusal.kind is RefusalKind.UNAUTHENTICATED and refusal.reason is Reason.CLIENT_CERTIFICATE_REQUIRED
    assert decide("/grpc.health.v1.Health/Check", None) is None


def test_unlisted_rpc_is_refused():
    assert decide("/fornax.x.v1.XService/Do", OPERATOR).reason is Reason.RPC_NOT_IN_POLICY


def test_evidence_put_is_for_operators_and_the_artifact_builder_revoke_for_operators():
    registry = "/fornax.evidence_registry.v1.EvidenceRegistryService/"
    builder = Identity(Role.SERVICE, "artifact-builder")
    assert decide(registry + "PutRecord", builder) is None
    assert decide(registry + "PutRecord", OPERATOR) is None
    assert decide(registry + "PutRecord", CLIENT).reason is Reason.ROLE_NOT_ALLOWED
    assert decide(registry + "PutRecord", Identity(Role.HOST, "gpu-box")).reason is Reason.ROLE_NOT_ALLOWED
    assert decide(registry + "RevokeRecord", builder).reason is Reason.ROLE_NOT_ALLOWED


def test_model_bytes_go_to_fleet_services_and_stages_not_to_clients():
    builder = "/fornax.artifact_builder.v1.ArtifactBuilderService/"
    assert decide(builder + "FetchArtifact", Identity(Role.STAGE, "stage-1")) is None
    assert decide(builder + "GetModelFiles", ORCHESTRATOR) is None
    assert decide(builder + "FetchArtifact", CLIENT).reason is Reason.ROLE_NOT_ALLOWED


def test_health_is_open_but_reflection_needs_a_fleet_certificate():
    assert decide("/grpc.health.v1.Health/Check", None) is None
    refusal = decide("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None)
    assert refusal is not None and refusal.reason is Reason.CLIENT_CERTIFICATE_REQUIRED
    assert decide("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                  Identity(Role.CLIENT, "app")) is None


def test_every_rpc_of_every_service_has_a_policy():
    import importlib

    from libs.security.authz import POLICY

    missing = []
    for name in ("orchestrator", "stage_worker", "evidence_registry", "artifact_builder", "planner"):
        module = importlib.import_module(f"fornax.{name}.v1.{name}_pb2")
        for service in module.DESCRIPTOR.services_by_name.values():
            missing += [f"/{service.full_name}/{m.name}" for m in service.methods
                        if f"/{service.full_name}/{m.name}" not in POLICY]
    assert missing == []


def test_only_the_control_plane_may_ask_a_stage_to_time_both_backends():
    assert decide(STAGE + "CompareDecodeStep", ORCHESTRATOR) is None
    assert decide(STAGE + "CompareDecodeStep", CLIENT).reason is Reason.ROLE_NOT_ALLOWED
