"""The route's settings (FORNAX_* variables): where the fleet is, what to install and how."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from libs.common.kinds import Backend, DType, block_activations_refusal
from libs.service.affinity import format_cpu_set, parse_cpu_set
from libs.service.env_settings import (
    Codec,
    choice,
    converted,
    integer,
    invalid,
    listed,
    number,
    one_of,
    read_env,
    setting,
    switch,
    text,
    write_env,
)
from libs.weights.policy import POLICIES
from services.orchestrator.route.backend_choice import DEFAULT_ROWS, SwitchPolicy, parse_rows, parse_switch_policy
from services.orchestrator.route.pool_discovery import StagePool
from services.orchestrator.route.replan_policy import ReplanSettings

# FORNAX_BACKEND value for an unlike fleet: each stage runs its own worker's backend.
BACKEND_OF_WORKER = "worker"
PLAN_MODES = ("exploratory", "deployment")


def _block_activations() -> Codec:
    """A worker's block-format activations (`libs.common.kinds.block_activations_refusal`); its
    backend is not known here, so only an unknown mode is refused (MAX_ACTIVATIONS_UNSUPPORTED)."""
    def parse(raw: str, variable: str) -> str:
        refusal = block_activations_refusal(raw)
        if refusal is not None:
            reason, message = refusal
            raise invalid(variable, raw, f"a mode MAX runs ({message})", reason)
        return raw

    return Codec(parse, str)


def _install_backend() -> Codec:
    """A backend, or None (written `worker`): each stage runs its own worker's backend."""
    backend = choice(Backend)

    def parse(raw: str, variable: str) -> Backend | None:
        if raw == BACKEND_OF_WORKER:
            return None
        try:
            return Backend(raw)
        except ValueError:
            raise invalid(variable, raw, "one of " + ", ".join([*Backend, BACKEND_OF_WORKER])) from None

    return Codec(parse, lambda value: BACKEND_OF_WORKER if value is None else backend.format(value), writes_none=True)


def _route_group(raw: str) -> tuple[int, ...]:
    group = tuple(int(part) for part in raw.split(","))
    if not group or min(group) < 0:
        raise ValueError(raw)
    return group


def _format_group(group: tuple[int, ...]) -> str:
    return ",".join(map(str, group))


def _addresses() -> Codec:
    return listed(text())


@dataclass(frozen=True)
class RouteSettings:
    planner_addr: str | None = setting("FORNAX_PLANNER_ADDR", None, text())
    artifact_builder_addr: str | None = setting("FORNAX_ARTIFACT_BUILDER_ADDR", None, text())
    # The evidence registry whose profiles and calibrations installs plan from.
    registry_addr: str | None = setting("FORNAX_REGISTRY_ADDR", None, text())
    # exploratory or deployment: see services.orchestrator.route.install.Fleet.plan_mode.
    plan_mode: str = setting("FORNAX_PLAN_MODE", "exploratory", one_of(PLAN_MODES, "INVALID_PLAN_MODE"))
    # gRPC addresses of the stage workers, in stage order.
    stage_workers: tuple[str, ...] = setting("FORNAX_STAGE_WORKERS", (), _addresses())
    # Public model id of the route (what /v1/models lists and requests must name).
    model_id: str = setting("FORNAX_MODEL_ID", "fornax", text())
    # numpy stage workers (stage order) that serve while MAX graphs compile; empty = none.
    reference_stage_workers: tuple[str, ...] = setting("FORNAX_REFERENCE_STAGE_WORKERS", (), _addresses())
    # CPU share of each stage (stage order) for background compiles; empty = inherited.
    stage_cpu_sets: tuple[tuple[int, ...], ...] = setting(
        "FORNAX_STAGE_CPU_SETS", (), listed(converted(parse_cpu_set, format_cpu_set, "a CPU set like 0-1;2,5"), ";"))
    # MAX compile cache of the in-process stages and of background compiles (the stage
    # workers' own); None = the backend's default (~/.cache/fornax/max).
    compile_cache_dir: str | None = setting("FORNAX_COMPILE_CACHE_DIR", None, text())
    # Installed on the stage workers at startup when set (with stage_workers).
    checkpoint: str | None = setting("FORNAX_CHECKPOINT", None, text())
    # None: each stage runs its own worker's backend (FORNAX_BACKEND=worker; unlike fleets).
    backend: Backend | None = setting("FORNAX_BACKEND", Backend.NUMPY, _install_backend())
    boundary_dtype: DType = setting("FORNAX_BOUNDARY_DTYPE", DType.BF16, choice(DType))
    # Per hop of the installed route; empty = boundary_dtype on every hop.
    hop_boundary_dtypes: tuple[DType, ...] = setting("FORNAX_HOP_BOUNDARY_DTYPES", (), listed(choice(DType)))
    # The weight policy of every stage (libs.weights.policy), or one per stage worker (aligned
    # with stage_workers) for a fleet that mixes formats per host.
    weights_policy: str = setting("FORNAX_WEIGHTS", "fp32", one_of(POLICIES))
    worker_weights: tuple[str, ...] = setting("FORNAX_WORKER_WEIGHTS", (), listed(one_of(POLICIES)))
    # The block-format activations each stage worker's MAX stages run (its --max-activations,
    # aligned with stage_workers; a numpy worker's entry is unused): background compiles compile
    # the graphs of these modes. Empty = every worker's default, int8.
    worker_max_activations: tuple[str, ...] = setting(
        "FORNAX_WORKER_MAX_ACTIVATIONS", (), listed(_block_activations()))
    # Whether the live switch from the numpy reference route to MAX happens only where each
    # stage's measured MAX decode step beats numpy's (measured), or unconditionally (always).
    max_switch: SwitchPolicy = setting("FORNAX_MAX_SWITCH", SwitchPolicy.MEASURED,
                                       Codec(lambda raw, variable: parse_switch_policy(raw, variable),
                                             lambda policy: policy.value))
    # The decode rows (sequences per step) the switch is measured at: the route's load.
    max_switch_rows: tuple[int, ...] = setting("FORNAX_MAX_SWITCH_ROWS", DEFAULT_ROWS,
                                               Codec(lambda raw, variable: parse_rows(raw, variable),
                                                     lambda rows: ",".join(map(str, rows))))
    # Replica routes served at once: groups of indices into stage_workers, one route per group
    # (in stage order within it), e.g. "0,1;2,3"; empty = one route over every stage worker.
    route_groups: tuple[tuple[int, ...], ...] = setting(
        "FORNAX_ROUTE_GROUPS", (), listed(converted(_route_group, _format_group, "worker indices like 0,1"), ";"))
    # The orchestrator's own state (model files fetched from the artifact builder).
    state_dir: str = setting("FORNAX_STATE_DIR", ".fornax/orchestrator", text())
    # KV bytes each stage keeps for the route; 0 leaves the stage worker's default.
    stage_kv_limit_bytes: int = setting("FORNAX_STAGE_KV_LIMIT_BYTES", 0, integer(0))
    # How long a draining or retiring route may take to finish what it admitted.
    drain_timeout_s: float = setting("FORNAX_DRAIN_TIMEOUT_S", 60.0, number())
    # How long a replica route may stay lost (a stage worker's host gone) before it leaves the
    # serving set the way a host drain takes it out (route/rejoin_watch.py); 0 = never: it waits
    # for its host however long, as a single route does.
    rejoin_timeout_s: float = setting("FORNAX_REJOIN_TIMEOUT_S", 0.0, number())
    # Headless Services of the stage-worker pools (`<service>:<port>`, stage order), whose DNS
    # records name each pool's workers (route/pool_discovery.py); empty = no discovery.
    stage_pools: tuple[StagePool, ...] = setting(
        "FORNAX_STAGE_POOLS", (), listed(converted(StagePool.parse, StagePool.format, "service:port")))
    # Re-plan onto the pools' workers when the set changes and stays changed (route/replan_policy.py).
    replan_on_change: bool = setting("FORNAX_REPLAN_ON_CHANGE", False, switch())
    discovery_interval_s: float = setting("FORNAX_DISCOVERY_INTERVAL_S", 10.0, number(0.0, exclusive=True))
    replan_settle_s: float = setting("FORNAX_REPLAN_SETTLE_S", ReplanSettings.settle_s, number())
    replan_min_interval_s: float = setting("FORNAX_REPLAN_MIN_INTERVAL_S", ReplanSettings.min_interval_s, number())

    def replan_settings(self) -> ReplanSettings:
        return ReplanSettings(self.replan_settle_s, self.replan_min_interval_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RouteSettings:
        return read_env(cls, env)

    def to_env(self, *fields: str) -> dict[str, str]:
        return write_env(self, fields)


@dataclass(frozen=True)
class InprocessSettings:
    """Serve a checkpoint with in-process stages at startup (development and tests); the
    networked route is installed with InstallPlan instead."""

    checkpoint: str | None = setting("FORNAX_INPROCESS_CHECKPOINT", None, text())
    stages: int = setting("FORNAX_INPROCESS_STAGES", 1, integer(1))
    backend: Backend = setting("FORNAX_INPROCESS_BACKEND", Backend.NUMPY, choice(Backend))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> InprocessSettings:
        return read_env(cls, env)

    def to_env(self, *fields: str) -> dict[str, str]:
        return write_env(self, fields)
