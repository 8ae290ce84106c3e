"""Who may call what: one table from gRPC method to the access it needs. Pure.

Unlisted methods are refused (fail closed), so a new RPC has to be placed here on purpose.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from libs.security.identity import Identity, Role

ORCHESTRATOR = Identity(Role.SERVICE, "orchestrator")
ARTIFACT_BUILDER = Identity(Role.SERVICE, "artifact-builder")


class Access(enum.Enum):
    # Anyone who completed the handshake, with a certificate or without (health).
    OPEN = "open"
    # Any fleet identity: read-only queries, and reflection (the services' shape is not public).
    FLEET = "fleet"
    # Client or operator role, or the API key: serving.
    SERVE = "serve"
    # Operator role only.
    OPERATOR = "operator"
    # Operator role, or the orchestrator acting on an operator's install.
    CONTROL = "control"
    # Operator role, or the artifact builder registering the model records it inspects.
    EVIDENCE_PUT = "evidence_put"
    # Model bytes: operators, services (the orchestrator's model files) and stages (artifacts).
    MODEL_BYTES = "model_bytes"


class RefusalKind(enum.Enum):
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"


class Reason(enum.Enum):
    CLIENT_CERTIFICATE_REQUIRED = "CLIENT_CERTIFICATE_REQUIRED"
    UNTRUSTED_CERTIFICATE = "UNTRUSTED_CERTIFICATE"
    ROLE_NOT_ALLOWED = "ROLE_NOT_ALLOWED"
    RPC_NOT_IN_POLICY = "RPC_NOT_IN_POLICY"
    # The call came through the TLS front, but on a connection whose identity it no longer holds.
    PEER_IDENTITY_UNKNOWN = "PEER_IDENTITY_UNKNOWN"


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    reason: Reason
    message: str


_ORCH = "/fornax.orchestrator.v1.OrchestratorService/"
_STAGE = "/fornax.stage_worker.v1.StageWorkerService/"
_REGISTRY = "/fornax.evidence_registry.v1.EvidenceRegistryService/"
_BUILDER = "/fornax.artifact_builder.v1.ArtifactBuilderService/"
_PLANNER = "/fornax.planner.v1.PlannerService/"

POLICY: dict[str, Access] = {
    _ORCH + "Generate": Access.SERVE,
    _ORCH + "Cancel": Access.SERVE,
    _ORCH + "InstallPlan": Access.OPERATOR,
    _ORCH + "DrainPlan": Access.OPERATOR,
    _ORCH + "RollbackPlan": Access.OPERATOR,
    _ORCH + "DrainHost": Access.OPERATOR,
    _ORCH + "AddRoutes": Access.OPERATOR,
    _ORCH + "GetPlanStatus": Access.FLEET,
    _STAGE + "GetCapabilities": Access.FLEET,
    _STAGE + "GetHealth": Access.FLEET,
    _STAGE + "LoadStage": Access.CONTROL,
    _STAGE + "UnloadStage": Access.CONTROL,
    _STAGE + "DrainStage": Access.CONTROL,
    _STAGE + "AdmitSequence": Access.CONTROL,
    _STAGE + "CancelRequest": Access.CONTROL,
    _STAGE + "ReleaseRequest": Access.CONTROL,
    _STAGE + "ProfileStage": Access.CONTROL,
    _STAGE + "OpenLinkProbe": Access.CONTROL,
    _STAGE + "ProfileLink": Access.CONTROL,
    _STAGE + "CompareDecodeStep": Access.CONTROL,
    _REGISTRY + "PutRecord": Access.EVIDENCE_PUT,
    _REGISTRY + "RevokeRecord": Access.OPERATOR,
    _REGISTRY + "GetRecord": Access.FLEET,
    _REGISTRY + "ListRecords": Access.FLEET,
    _REGISTRY + "ResolveRecords": Access.FLEET,
    _BUILDER + "BuildStageArtifacts": Access.CONTROL,
    _BUILDER + "InspectCheckpoint": Access.FLEET,
    _BUILDER + "VerifyArtifact": Access.FLEET,
    _BUILDER + "FetchArtifact": Access.MODEL_BYTES,
    _BUILDER + "GetModelFiles": Access.MODEL_BYTES,
    _PLANNER + "CreatePlan": Access.FLEET,
    _PLANNER + "GetPlan": Access.FLEET,
}

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
FLEET_PREFIXES = ("/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")

# Actions that change fleet state: audited whatever their outcome.
MUTATING = frozenset({
    _ORCH + "InstallPlan", _ORCH + "DrainPlan", _ORCH + "RollbackPlan", _ORCH + "DrainHost",
    _ORCH + "AddRoutes",
    _STAGE + "LoadStage", _STAGE + "UnloadStage", _STAGE + "DrainStage",
    _REGISTRY + "PutRecord", _REGISTRY + "RevokeRecord", _BUILDER + "BuildStageArtifacts",
})


def access_for(method: str) -> Access | None:
    if method.startswith(OPEN_PREFIXES):
        return Access.OPEN
    if method.startswith(FLEET_PREFIXES):
        return Access.FLEET
    return POLICY.get(method)


def _allowed(access: Access, identity: Identity, api_key_ok: bool) -> bool:
    if access in (Access.OPEN, Access.FLEET):
        return True
    if access is Access.SERVE:
        return identity.role in (Role.CLIENT, Role.OPERATOR) or api_key_ok
    if access is Access.OPERATOR:
        return identity.role is Role.OPERATOR
    if access is Access.MODEL_BYTES:
        return identity.role in (Role.OPERATOR, Role.SERVICE, Role.STAGE)
    if access is Access.EVIDENCE_PUT:
        return identity.role is Role.OPERATOR or identity == ARTIFACT_BUILDER
    return identity.role is Role.OPERATOR or identity == ORCHESTRATOR


def decide(method: str, identity: Identity | None, api_key_ok: bool = False) -> Refusal | None:
    """None when identity may call method; else why not."""
    access = access_for(method)
    if access is Access.OPEN:
        return None
    if access is None:
        return Refusal(RefusalKind.PERMISSION_DENIED, Reason.RPC_NOT_IN_POLICY,
                       f"{method} is not in the authorization policy")
    if identity is None:
        return Refusal(RefusalKind.UNAUTHENTICATED, Reason.CLIENT_CERTIFICATE_REQUIRED,
                       f"{method} needs a fleet client certificate")
    if not _allowed(access, identity, api_key_ok):
        return Refusal(RefusalKind.PERMISSION_DENIED, Reason.ROLE_NOT_ALLOWED,
                       f"{identity} may not call {method} (needs {access.value} access)")
    return None
