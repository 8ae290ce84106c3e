"""Planner results: plans, stages, predicted cost terms, rejections. Pure values."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

# Stable reason codes of rejected nodes, routes and infeasible answers.
MISSING_DTYPE = "MISSING_DTYPE"
MISSING_BOUNDARY_DTYPE = "MISSING_BOUNDARY_DTYPE"
MISSING_OPERATION = "MISSING_OPERATION"
MISSING_WEIGHT_FORMAT = "MISSING_WEIGHT_FORMAT"
INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
NO_ROUTE = "NO_ROUTE"
NO_CAPABLE_NODE = "NO_CAPABLE_NODE"
LAYER_TOO_LARGE = "LAYER_TOO_LARGE"
STAGE_BOUNDS = "STAGE_BOUNDS"
NO_FEASIBLE_PLACEMENT = "NO_FEASIBLE_PLACEMENT"
EVIDENCE_UNRESOLVED = "EVIDENCE_UNRESOLVED"
MISSING_EVIDENCE = "MISSING_EVIDENCE"
# Stable reason codes of replica-route layouts (`services.planner.replicas`).
TOO_MANY_HOSTS_FOR_ROUTES = "TOO_MANY_HOSTS_FOR_ROUTES"  # more hosts than the exhaustive layout search covers
BAD_ROUTE_COUNT = "BAD_ROUTE_COUNT"  # N routes asked of fewer than N hosts, or N < 1
CONCURRENCY_BELOW_ROUTES = "CONCURRENCY_BELOW_ROUTES"  # fewer target sequences than routes

# Stable reason codes of a deployment refused for want of measured evidence (FAILED_PRECONDITION).
MISSING_PROFILE = "MISSING_PROFILE"  # a host, a layer kind on a host, or a link has no profile
PROFILE_EXPIRED = "PROFILE_EXPIRED"  # past its validity window (the registry's or the blob's own)
PROFILE_REVOKED = "PROFILE_REVOKED"
PROFILE_UNRESOLVED = "PROFILE_UNRESOLVED"  # the registry does not vouch for it (not found, hash, ...)
PROFILE_NOT_PHYSICAL = "PROFILE_NOT_PHYSICAL"  # not a physical-class record
PROFILE_MISMATCH = "PROFILE_MISMATCH"  # measured for another model snapshot or backend
MISSING_CALIBRATION = "MISSING_CALIBRATION"
CALIBRATION_FAILED = "CALIBRATION_FAILED"
CALIBRATION_EXPIRED = "CALIBRATION_EXPIRED"
CALIBRATION_UNRESOLVED = "CALIBRATION_UNRESOLVED"
CALIBRATION_STALE = "CALIBRATION_STALE"  # qualified on other profile records than the plan rests on

# Evidence classes of a plan term.
TERM_PHYSICAL = "physical"  # a prediction computed from physical measurement records
TERM_DECLARED = "declared"  # a declared figure filling a gap (exploratory only)


@dataclass(frozen=True)
class Rejection:
    subject: str  # a node name, or "from->to" for a route
    reason: str
    detail: str
    required: float = 0.0
    available: float = 0.0


@dataclass(frozen=True)
class StageCost:
    """Predicted seconds per microbatch, kept separate. Predictions, not measurements."""

    compute_s: float
    pack_s: float
    wire_s: float
    unpack_s: float
    queue_s: float = 0.0
    exposed_wait_s: float = 0.0

    @property
    def service_s(self) -> float:
        return self.compute_s + self.pack_s + self.unpack_s


@dataclass(frozen=True)
class TermEvidence:
    """Where one predicted decode term of a stage comes from."""

    term: str  # compute, pack, wire, unpack, memory
    evidence_class: str  # TERM_PHYSICAL or TERM_DECLARED
    record_ids: tuple[str, ...]
    note: str
    value: float
    unit: str
    # The route calibration record that scaled this term (`route_feedback`); empty: layer profiles alone.
    calibration_id: str = ""

    @property
    def basis(self) -> str:
        """Which measurements the term comes from: a route calibration or layer profiles."""
        if self.evidence_class != TERM_PHYSICAL:
            return "declared"
        return f"route calibration {self.calibration_id}" if self.calibration_id else "layer profiles"

    @property
    def label(self) -> str:
        if self.evidence_class == TERM_PHYSICAL:
            return "physical: prediction computed from measurement records " + ", ".join(self.record_ids)
        return "declared, exploratory"


@dataclass(frozen=True)
class PlannedStage:
    stage_index: int
    node: str
    backend: str
    build: str
    layer_start: int
    layer_end: int  # exclusive
    owns_embeddings: bool
    owns_head: bool
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int
    reserve_bytes: int
    node_memory_bytes: int
    decode: StageCost
    prefill: StageCost
    terms: tuple[TermEvidence, ...] = ()
    host: str = ""
    # A MAX stage's block-format activations (its node's `Node.activations`: the mode the stage is
    # loaded in and its profile was timed in); "" on a stage of another backend.
    max_activations: str = ""

    @property
    def memory_bytes(self) -> int:
        """Everything the stage holds on its node, the node's reserve included."""
        return self.weight_bytes + self.kv_bytes + self.activation_bytes + self.reserve_bytes


@dataclass(frozen=True)
class Prediction:
    name: str
    value: float
    unit: str


@dataclass(frozen=True)
class Plan:
    plan_id: str
    plan_hash: str
    mode: str
    objective: str
    model_snapshot: str
    method: str
    stages: tuple[PlannedStage, ...]
    predictions: tuple[Prediction, ...]
    evidence_ids: tuple[str, ...] = ()
    route_key: str = ""
    calibration_id: str = ""
    # Why this placement among those the measured spread cannot tell apart (plans from profiles;
    # `services.planner.stability`); every figure in it is a prediction.
    choice: str = ""

    @property
    def from_profiles(self) -> bool:
        return bool(self.route_key)

    @property
    def declared_terms(self) -> int:
        return sum(t.evidence_class == TERM_DECLARED for s in self.stages for t in s.terms)

    @property
    def label(self) -> str:
        if self.from_profiles:
            where = ("every term from a valid physical profile and a passing route calibration "
                     f"({self.calibration_id})" if self.mode == "deployment" else
                     f"terms from physical profiles; {self.declared_terms} term(s) declared, exploratory")
            return f"{self.mode}: {where}; time figures are predictions computed from physical measurements"
        if self.mode == "deployment":
            return ("deployment: every referenced evidence record resolved; "
                    "time figures are still cost-model predictions")
        return ("exploratory: placement from declared inventory figures; "
                "every time figure is a cost-model prediction, not a measurement")

    def prediction(self, name: str) -> float:
        for p in self.predictions:
            if p.name == name:
                return p.value
        raise KeyError(name)


@dataclass(frozen=True)
class EvidenceFailure:
    record_id: str
    subject: str  # what referenced it: "model", a node name or "from->to"
    reason: str
    detail: str


@dataclass(frozen=True)
class RouteShare:
    """One route (replica pipeline) of a layout: its plan, predicted at its share of the target
    concurrency (the plan's own target concurrency)."""

    plan: Plan
    concurrency: int


@dataclass(frozen=True)
class LayoutCandidate:
    """One way to partition the hosts into routes, with its predicted fleet throughput (a
    prediction of the cost model at each route's share of the concurrency, summed)."""

    layout: str  # e.g. "2 routes: a>b | c>d"
    routes: int
    hosts: tuple[tuple[str, ...], ...]  # the host group each route was planned on
    feasible: bool
    tokens_per_s: float = 0.0  # predicted aggregate decode tokens/s at the target concurrency
    band_tokens_per_s: tuple[float, float] = (0.0, 0.0)  # (slowest, fastest) over the measured spread
    shares: tuple[int, ...] = ()  # sequences per route
    reason: str = ""  # stable reason code when infeasible
    detail: str = ""


@dataclass(frozen=True)
class RouteChoice:
    """Why this layout (`services.planner.replicas`); every figure in it is a prediction."""

    rule: str
    chosen: int  # index into candidates
    candidates: tuple[LayoutCandidate, ...]
    explanation: str


@dataclass(frozen=True)
class PlanResult:
    feasible: bool
    plan: Plan | None  # the first (or only) route's plan
    rejections: tuple[Rejection, ...] = ()
    infeasibility: str = ""
    infeasibility_reason: str = ""
    shortfall_bytes: float = 0.0
    evidence_failures: tuple[EvidenceFailure, ...] = field(default_factory=tuple)
    # Multi-route planning (`replicas.plan_routes`): every route of the chosen layout (routes[0].plan
    # is `plan`) and the layout choice with every candidate; empty / None for a single-route plan.
    routes: tuple[RouteShare, ...] = ()
    route_choice: RouteChoice | None = None


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def plan_identity(content: dict[str, object]) -> tuple[str, str]:
    """(plan_id, plan_hash) of the canonical JSON of a plan's structural content."""
    digest = hashlib.sha256(canonical_json(content)).hexdigest()
    return f"plan-{digest[:16]}", f"sha256:{digest}"
