"""Reference (numpy) stage workers that serve while the MAX graphs compile.

With `--backend max`, each stage gets a second worker on the same CPU share running the
float32 numpy backend. The orchestrator serves on them at once when the compile cache lacks a
graph, compiles in the background, then moves the route to the MAX workers (see
`services.orchestrator.route.coldstart`). Idle workers cost memory, not CPU.
"""

from __future__ import annotations

from apps.fleet.launcher import FleetOptions, ServiceProcess
from libs.service.affinity import worker_env as affinity_env
from libs.service.fleet_state import ServiceEntry
from services.orchestrator.route.settings import RouteSettings

REFERENCE_BACKEND = "numpy"


def wants_reference_workers(options: FleetOptions) -> bool:
    """A deployment serves only a qualified route, never the numpy reference one meanwhile."""
    return (options.backend != REFERENCE_BACKEND and bool(options.checkpoint) and options.serve_while_compiling
            and options.plan_mode != "deployment")


REFERENCE_SUFFIX = "_reference"


def reference_name(index: int) -> str:
    return f"stage_worker_{index}{REFERENCE_SUFFIX}"


def is_reference_name(name: str) -> bool:
    return name.endswith(REFERENCE_SUFFIX)


def reference_workers(options: FleetOptions, cpu_sets: list[tuple[int, ...]]) -> list[ServiceProcess]:
    return [
        ServiceProcess(reference_name(index), "stage_worker", "services.stage_worker", {
            **affinity_env(cpu_sets[index]),
            "FORNAX_STAGE_INDEX": str(index),
            "FORNAX_BACKEND": REFERENCE_BACKEND,
        })
        for index in range(options.stages)
    ]


def orchestrator_reference_env(options: FleetOptions, entries: dict[str, ServiceEntry],
                               cpu_sets: list[tuple[int, ...]]) -> dict[str, str]:
    references = tuple(entries[reference_name(i)].grpc for i in range(options.stages)) \
        if wants_reference_workers(options) else ()
    route = RouteSettings(stage_cpu_sets=tuple(cpu_sets), reference_stage_workers=references)
    return route.to_env("stage_cpu_sets", *(("reference_stage_workers",) if references else ()))
