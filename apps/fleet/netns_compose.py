"""A fleet file's services, each started inside its host: cgroups, network namespace, clock.

The control host runs the evidence registry, planner, artifact builder and orchestrator; every
stage host runs one stage worker with its own backend, and a MAX host chosen by
`fleet_reference` a numpy reference worker beside it while its graphs compile. Each service gets a private state
directory under `<state>/hosts/<host>/<service>`; the harness keeps only logs and ready files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

from apps.fleet.compose import orchestrator_options_env
from apps.fleet.fleet_reference_inputs import REFERENCE_KV_LIMIT_BYTES
from apps.fleet.launcher import FleetOptions, Launcher, LaunchError, ServiceProcess, builder_read_roots
from apps.fleet.netns_plan import HostPlan, NetnsPlan, host_command
from apps.fleet.reference import REFERENCE_BACKEND, reference_name
from apps.fleet.spec import FleetSpec, HostSpec
from libs.common.kinds import Backend, DType
from libs.security.store import CertStore
from libs.service.affinity import THREAD_VARIABLES
from libs.service.env_settings import parse_setting
from libs.service.fleet_state import FleetState, ServiceEntry

LOOPBACK = "127.0.0.1"



def _private_dir(options: FleetOptions, host: HostPlan, service: str) -> Path:
    path = options.state_dir / "hosts" / host.spec.name / service
    path.mkdir(parents=True, exist_ok=True)
    return path


def _process(host: HostPlan, name: str, kind: str, env: dict[str, str]) -> ServiceProcess:
    wrap = partial(host_command, host)
    if not host.spec.link.delay_ns:
        return ServiceProcess(name, kind, f"services.{kind}", env, host=host.address, wrap=wrap)
    # A delayed host serves on loopback; a relay on its fabric address adds the delay inbound.
    env = {**env, "FORNAX_ADVERTISE_HOST": host.address} if kind == "stage_worker" else env
    return ServiceProcess(name, kind, f"services.{kind}", env, host=host.address, wrap=wrap,
                          bind_host=LOOPBACK, on_ready=partial(start_relay, host))


def start_relay(host: HostPlan, ports: dict[str, int]) -> subprocess.Popen:
    """One relay per service, inside the host (its namespace and cgroup): `fornax down` removes
    it with the host."""
    pairs = [f"{host.address}:{port}={LOOPBACK}:{port}" for key, port in ports.items() if key != "pid"]
    argv = [sys.executable, "-m", "apps.fleet.relay", "--delay-ms", str(host.spec.link.delay_ns / 1e6), *pairs]
    return subprocess.Popen(host_command(host, argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _control_env(options: FleetOptions, host: HostPlan) -> dict[str, str]:
    # Math pools sized to the host's quota, so a half-core host does not run two BLAS threads.
    return {name: str(host.thread_count) for name in THREAD_VARIABLES}


def worker_process(options: FleetOptions, host: HostPlan, index: int, reference: bool = False) -> ServiceProcess:
    """The host's stage worker; with `reference`, the numpy reference worker of its stage, inside
    the same host (namespace, cgroup, memory limit) and admitted the same way."""
    device = host.spec.device
    name = reference_name(index) if reference else f"stage_worker_{index}"
    # A MAX host's block-format activations (a reference worker runs numpy: none).
    activations = "" if reference else host_max_activations(options, host.spec)
    env = {
        **_control_env(options, host),
        "FORNAX_STAGE_INDEX": str(index),
        # The fleet's own statement of a CPU it could not keep to this host alone: profiles carry it.
        "FORNAX_CPU_SHARED_WITH": ",".join(host.cpu_share.shared_with),
        "FORNAX_BACKEND": REFERENCE_BACKEND if reference else host.spec.backend.value,
        # A reference worker's KV is capped, as `fleet_reference_inputs` counts it.
        **({"FORNAX_KV_LIMIT_BYTES": str(REFERENCE_KV_LIMIT_BYTES)} if reference else {}),
        "FORNAX_DEVICE": "cpu" if device == "cpu" else "gpu",
        # gpu:N is that one GPU, and only it, for this host's worker.
        **({"CUDA_VISIBLE_DEVICES": device.split(":", 1)[1]} if device.startswith("gpu:") else {}),
        "FORNAX_STATE_DIR": str(_private_dir(options, host, name)),
        **({"FORNAX_READ_ROOTS": os.pathsep.join(str(Path(r).resolve()) for r in options.stage_read_roots)}
           if options.stage_read_roots else {}),
        **({"FORNAX_MAX_ACTIVATIONS": activations} if activations else {}),
    }
    return _process(host, name, "stage_worker", env)


def host_max_activations(options: FleetOptions, host: HostSpec) -> str:
    """The block-format activations a host's MAX stage runs: the file's, else `--max-activations`;
    "" on a numpy host, or where neither sets one (the worker's default, int8)."""
    if host.backend is not Backend.MAX:
        return ""
    return host.max_activations or options.max_activations


def reference_addresses(entries: dict[str, ServiceEntry], stages: int) -> tuple[str, ...]:
    """FORNAX_REFERENCE_STAGE_WORKERS of a fleet, stage order: a MAX host's reference worker, and a
    numpy host's own worker (which holds both routes' generations during the switch); () when no
    host runs a reference worker."""
    if not any(reference_name(i) in entries for i in range(stages)):
        return ()
    return tuple(entries.get(reference_name(i), entries[f"stage_worker_{i}"]).grpc for i in range(stages))


def _orchestrator_env(options: FleetOptions, spec: FleetSpec, entries: dict[str, ServiceEntry],
                      workers: list[str], control: HostPlan) -> dict[str, str]:
    from services.orchestrator.api.settings import HttpSettings
    from services.orchestrator.route.settings import RouteSettings
    route = RouteSettings(
        planner_addr=entries["planner"].grpc,
        registry_addr=entries["evidence_registry"].grpc,
        artifact_builder_addr=entries["artifact_builder"].grpc,
        stage_workers=tuple(workers),
        worker_weights=tuple(parse_setting(RouteSettings, "weights_policy", h.weights or options.weights)
                             for h in spec.stage_hosts),
        # What each host's MAX stage runs, so the background compile compiles those graphs.
        worker_max_activations=tuple(host_max_activations(options, h) or "int8" for h in spec.stage_hosts),
        boundary_dtype=(spec.hop_dtypes or (DType.FP32,))[0],
        hop_boundary_dtypes=tuple(spec.hop_dtypes),
        backend=None,  # each stage runs its own host's backend
        state_dir=str(_private_dir(options, control, "orchestrator")),
        route_groups=options.route_groups,
        # Background compiles run in the orchestrator's own host, on its quota (no cpusets of
        # other hosts: a process cannot leave its cgroup's cpuset).
        reference_stage_workers=reference_addresses(entries, len(workers)),
    )
    env = {
        **_control_env(options, control),
        **route.to_env("planner_addr", "registry_addr", "artifact_builder_addr", "stage_workers", "worker_weights",
                       "worker_max_activations",
                       "boundary_dtype", "hop_boundary_dtypes", "backend", "state_dir", "route_groups",
                       *(("reference_stage_workers",) if route.reference_stage_workers else ())),
    }
    # The API listens on a fabric address (198.18.0.0/15), beyond loopback: https with the
    # orchestrator's fleet certificate, whose SANs name that address; clients verify it with
    # the fleet CA named in fleet.json. Plain HTTP only when chosen (and then the orchestrator
    # logs http_plaintext_beyond_loopback); a --insecure fleet has no certificate to serve.
    if options.http_insecure or options.insecure:
        env |= HttpSettings(insecure=True).to_env("insecure")
    return env | orchestrator_options_env(options)


def api_endpoint(options: FleetOptions, address: str, port: int | None) -> tuple[str | None, str | None]:
    """(API base URL, CA bundle that verifies it) of a netns fleet's orchestrator."""
    if not port:
        return None, None
    if options.http_insecure or options.insecure:
        return f"http://{address}:{port}/v1", None
    return f"https://{address}:{port}/v1", str(CertStore(options.state_dir).ca_cert)


def start_netns_fleet(options: FleetOptions, spec: FleetSpec, plan: NetnsPlan,
                      reference_hosts: frozenset[str] = frozenset()) -> tuple[FleetState, Launcher]:
    """Start every service in its host and wait until each is SERVING; stops them on failure.
    Each host in `reference_hosts` runs a numpy reference stage worker beside its own
    (`fleet_reference`)."""
    launcher = Launcher(options)
    control = plan.host(spec.control_host)
    try:
        registry_dir = _private_dir(options, control, "evidence_registry")
        registry = launcher.spawn(_process(control, "evidence_registry", "evidence_registry", {
            **_control_env(options, control),
            "FORNAX_REGISTRY_DB": str(registry_dir / "registry.db"),
            "FORNAX_REGISTRY_BLOB_DIR": str(registry_dir / "blobs"),
        }))
        launcher.wait_ready([registry])
        registry_addr = registry.entry().grpc
        middle = [
            launcher.spawn(_process(control, "planner", "planner",
                                    {**_control_env(options, control), "FORNAX_REGISTRY_ADDR": registry_addr})),
            launcher.spawn(_process(control, "artifact_builder", "artifact_builder", {
                **_control_env(options, control), "FORNAX_REGISTRY_ADDR": registry_addr,
                "FORNAX_ARTIFACT_STORE": str(_private_dir(options, control, "artifact_builder")),
                "FORNAX_READ_ROOTS": builder_read_roots(options),
            })),
        ]
        stage_hosts = [h for h in plan.hosts if h.spec.stage_worker]
        middle += [launcher.spawn(worker_process(options, host, i)) for i, host in enumerate(stage_hosts)]
        middle += [launcher.spawn(worker_process(options, host, i, reference=True))
                   for i, host in enumerate(stage_hosts) if host.spec.name in reference_hosts]
        launcher.wait_ready(middle)
        entries = {s.spec.name: s.entry() for s in launcher.started}
        workers = [entries[f"stage_worker_{i}"].grpc for i in range(len(stage_hosts))]
        orchestrator = launcher.spawn(_process(control, "orchestrator", "orchestrator",
                                               _orchestrator_env(options, spec, entries, workers, control)))
        launcher.wait_ready([orchestrator])
    except (LaunchError, OSError, KeyboardInterrupt):
        launcher.stop_all()
        raise
    api, api_ca = api_endpoint(options, control.address, orchestrator.ports.get("http"))
    state = FleetState(services=tuple(s.entry() for s in launcher.started), api=api, api_key=options.api_key,
                       tls=not options.insecure, api_ca=api_ca)
    return state, launcher
