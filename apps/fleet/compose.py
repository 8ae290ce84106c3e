"""The default local fleet and the order it starts in.

Registry first (others point at it), then planner, artifact builder and the stage workers
together, then the orchestrator, which is told every other address.
"""

from __future__ import annotations

from apps.fleet.launcher import (
    HOST,
    FleetOptions,
    Launcher,
    LaunchError,
    ServiceProcess,
    Started,
    builder_read_roots,
)
from apps.fleet.reference import orchestrator_reference_env, reference_workers, wants_reference_workers
from libs.service.affinity import usable_cpus, worker_cpu_sets
from libs.service.affinity import worker_env as affinity_env
from libs.service.env_settings import parse_setting
from libs.service.fleet_state import FleetState, ServiceEntry


def _registry_env(options: FleetOptions) -> dict[str, str]:
    registry_dir = options.state_dir / "registry"
    return {
        "FORNAX_REGISTRY_DB": str(registry_dir / "registry.db"),
        "FORNAX_REGISTRY_BLOB_DIR": str(registry_dir / "blobs"),
    }


def _orchestrator_env(options: FleetOptions, entries: dict[str, ServiceEntry]) -> dict[str, str]:
    from services.orchestrator.route.settings import RouteSettings
    route = RouteSettings(
        planner_addr=entries["planner"].grpc,
        registry_addr=entries["evidence_registry"].grpc,
        artifact_builder_addr=entries["artifact_builder"].grpc,
        stage_workers=tuple(entries[f"stage_worker_{i}"].grpc for i in range(options.stages)),
        boundary_dtype=parse_setting(RouteSettings, "boundary_dtype", options.boundary_dtype),
        backend=parse_setting(RouteSettings, "backend", options.backend),
        state_dir=str(options.state_dir / "orchestrator"),
        # The background compile compiles the graphs of the mode the stage workers run.
        worker_max_activations=(options.max_activations,) * options.stages if options.max_activations else (),
    )
    fleet = route.to_env("planner_addr", "registry_addr", "artifact_builder_addr", "stage_workers",
                         "boundary_dtype", "backend", "state_dir", "worker_max_activations")
    return fleet | orchestrator_options_env(options)


def orchestrator_options_env(options: FleetOptions) -> dict[str, str]:
    """The orchestrator settings that come straight from `fornax up`'s options, on any fleet."""
    from services.orchestrator.api.settings import HttpSettings
    from services.orchestrator.route.settings import RouteSettings
    route = RouteSettings(
        plan_mode=parse_setting(RouteSettings, "plan_mode", options.plan_mode),
        weights_policy=parse_setting(RouteSettings, "weights_policy", options.weights),
        max_switch=parse_setting(RouteSettings, "max_switch", options.max_switch),
        max_switch_rows=parse_setting(RouteSettings, "max_switch_rows", options.max_switch_rows),
        checkpoint=options.checkpoint or None,
        rejoin_timeout_s=options.rejoin_timeout_s,
    )
    http = HttpSettings(port=options.http_port or 0, api_key=options.api_key or None)
    return {**route.to_env("plan_mode", "weights_policy", "max_switch", "max_switch_rows", "checkpoint",
                           "rejoin_timeout_s"),
            **http.to_env("api_key", *(("port",) if options.http_port is not None else ()))}


def start_fleet(options: FleetOptions) -> tuple[FleetState, Launcher]:
    """Start every service and wait until each is SERVING. Stops what it started on failure."""
    launcher = Launcher(options)
    try:
        registry = launcher.spawn(
            ServiceProcess(
                "evidence_registry", "evidence_registry", "services.evidence_registry", _registry_env(options)
            )
        )
        launcher.wait_ready([registry])
        registry_addr = f"{HOST}:{registry.ports['grpc']}"
        cpu_sets = worker_cpu_sets(options.stages, usable_cpus())
        middle = _spawn_middle(launcher, options, registry_addr, cpu_sets)
        launcher.wait_ready(middle)
        entries = {s.spec.name: s.entry() for s in launcher.started}
        orchestrator_env = {**_orchestrator_env(options, entries),
                            **orchestrator_reference_env(options, entries, cpu_sets)}
        orchestrator = launcher.spawn(
            ServiceProcess("orchestrator", "orchestrator", "services.orchestrator", orchestrator_env)
        )
        launcher.wait_ready([orchestrator])
    except (LaunchError, OSError, KeyboardInterrupt):
        launcher.stop_all()
        raise
    entries_in_order = tuple(s.entry() for s in launcher.started)
    http = orchestrator.ports.get("http")
    api = f"http://{HOST}:{http}/v1" if http else None
    state = FleetState(services=entries_in_order, api=api, api_key=options.api_key, tls=not options.insecure)
    return state, launcher


def _spawn_middle(launcher: Launcher, options: FleetOptions, registry_addr: str,
                  cpu_sets: list[tuple[int, ...]]) -> list[Started]:
    """The services between the registry and the orchestrator: planner, artifact builder,
    stage workers (and reference workers when the fleet switches backends)."""
    middle = [
        launcher.spawn(
            ServiceProcess("planner", "planner", "services.planner", {"FORNAX_REGISTRY_ADDR": registry_addr})
        ),
        launcher.spawn(
            ServiceProcess(
                "artifact_builder",
                "artifact_builder",
                "services.artifact_builder",
                {
                    "FORNAX_REGISTRY_ADDR": registry_addr,
                    "FORNAX_ARTIFACT_STORE": str(options.state_dir / "artifacts"),
                    "FORNAX_READ_ROOTS": builder_read_roots(options),
                },
            )
        ),
    ]
    for index in range(options.stages):
        worker_env = {
            **affinity_env(cpu_sets[index]),
            "FORNAX_STAGE_INDEX": str(index),
            "FORNAX_BACKEND": options.backend,
            "FORNAX_STATE_DIR": str(options.state_dir / f"stage_worker_{index}"),
            # Stages load only the artifacts the builder wrote.
            "FORNAX_READ_ROOTS": str(options.state_dir / "artifacts"),
            **({"FORNAX_MAX_ACTIVATIONS": options.max_activations} if options.max_activations else {}),
        }
        middle.append(
            launcher.spawn(
                ServiceProcess(f"stage_worker_{index}", "stage_worker", "services.stage_worker", worker_env)
            )
        )
    if wants_reference_workers(options):
        middle += [launcher.spawn(spec) for spec in reference_workers(options, cpu_sets)]
    return middle
