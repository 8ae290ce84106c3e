"""Start and stop a local fleet: one OS process per service, bound to 127.0.0.1.

Ports are chosen by the OS unless configured; each service reports what it bound through its
ready file, and the launcher then confirms SERVING over the gRPC health protocol.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from apps.fleet.health import check_health
from apps.fleet.trust import FleetTrust, prepare_trust
from libs.service.fleet_state import ServiceEntry
from libs.service.host import pid_alive

HOST = "127.0.0.1"


class LaunchError(RuntimeError):
    """A service failed to start; the message carries the tail of its log."""


@dataclass(frozen=True)
class FleetOptions:
    state_dir: Path
    stages: int = 2
    backend: str = "numpy"
    boundary_dtype: str = "bf16"
    # The weight policy of every stage (libs.weights.policy); a fleet file's hosts may override it.
    weights: str = "fp32"
    # Block-format activations of every MAX stage (a stage worker's --max-activations); a fleet
    # file's MAX hosts may override it. "" = each worker's default (int8).
    max_activations: str = ""
    checkpoint: str | None = None
    http_port: int | None = None
    api_key: str | None = None
    # With a MAX backend: serve on numpy workers at once while MAX graphs compile.
    serve_while_compiling: bool = True
    # With a MAX backend and reference workers: switch to MAX only where each stage measured it
    # at least as fast as numpy ("measured"), or unconditionally ("always").
    max_switch: str = "measured"
    max_switch_rows: str = "1,8"  # the decode rows that measurement times: the route's load
    startup_timeout_s: float = 120.0
    grace_period_s: float = 10.0
    # Plaintext gRPC with no authentication: only when asked for explicitly.
    insecure: bool = False
    # Plain HTTP for an API bound beyond loopback (a netns fleet's fabric address): only when
    # asked for explicitly; by default it serves https with the orchestrator's fleet certificate.
    http_insecure: bool = False
    # Directories the artifact builder may read checkpoints from, besides --checkpoint.
    read_roots: tuple[str, ...] = ()
    # Directories stage workers may load checkpoints from directly (benchmarks that load explicit
    # layer ranges without the planner); empty: workers load only fetched artifacts.
    stage_read_roots: tuple[str, ...] = ()
    # Extra environment for every service (e.g. OTEL_EXPORTER_OTLP_ENDPOINT).
    env: dict[str, str] = field(default_factory=dict)
    # How the orchestrator plans installs: exploratory, or deployment (valid profiles and a
    # passing route calibration in the registry, else the install is refused).
    plan_mode: str = "exploratory"
    # Replica routes (FORNAX_ROUTE_GROUPS of the orchestrator): indices into the stage workers,
    # one group per route; empty: one route over every stage worker.
    route_groups: tuple[tuple[int, ...], ...] = ()
    # Seconds a replica route may stay lost (a stage host gone) before the orchestrator removes
    # it from the serving set (FORNAX_REJOIN_TIMEOUT_S); 0 = never.
    rejoin_timeout_s: float = 0.0


def builder_read_roots(options: FleetOptions) -> str:
    """FORNAX_READ_ROOTS of the artifact builder: --read-root directories and the checkpoint."""
    roots = [*options.read_roots, *([options.checkpoint] if options.checkpoint else [])]
    return os.pathsep.join(str(Path(root).resolve()) for root in roots)


@dataclass(frozen=True)
class ServiceProcess:
    name: str
    kind: str
    module: str
    env: dict[str, str]
    # Address the service binds and is reached at; a fleet host's namespace address.
    host: str = HOST
    # Wraps the interpreter's argv, e.g. to enter a fleet host's cgroups and namespaces.
    wrap: Callable[[list[str]], list[str]] | None = None
    # Address the service binds when it differs from `host` (a relay fronts it there).
    bind_host: str | None = None
    # Called with the bound ports once the ready file appears, before the health check.
    on_ready: Callable[[dict[str, int]], object] | None = None


@dataclass
class Started:
    spec: ServiceProcess
    process: subprocess.Popen
    ready_file: Path
    log_file: Path
    ports: dict[str, int] = field(default_factory=dict)
    log_start: int = 0  # the log's size before this process wrote to it

    def entry(self) -> ServiceEntry:
        host = self.spec.host
        extra = {key: f"{host}:{port}" for key, port in self.ports.items() if key not in ("grpc", "metrics", "pid")}
        return ServiceEntry(
            name=self.spec.name,
            kind=self.spec.kind,
            grpc=f"{host}:{self.ports['grpc']}",
            metrics=f"{host}:{self.ports['metrics']}",
            pid=self.process.pid,
            log=str(self.log_file),
            extra=extra,
            log_start=self.log_start,
        )


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Launcher:
    def __init__(self, options: FleetOptions):
        self.options = options
        self.started: list[Started] = []
        self._run_dir = options.state_dir / "run"
        self._log_dir = options.state_dir / "logs"
        self.trust: FleetTrust = prepare_trust(options.state_dir, options.insecure)

    def spawn(self, spec: ServiceProcess) -> Started:
        self._run_dir.mkdir(parents=True, exist_ok=True)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        ready = self._run_dir / f"{spec.name}.ready.json"
        ready.unlink(missing_ok=True)
        log_file = self._log_dir / f"{spec.name}.log"
        env = {
            **os.environ,
            **self.options.env,
            **spec.env,
            **self.trust.service_env(spec.name, spec.kind, spec.host),
            "FORNAX_HOST": spec.bind_host or spec.host,
            "FORNAX_READY_FILE": str(ready),
            "FORNAX_GRACE_PERIOD_S": str(self.options.grace_period_s),
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", spec.module]
        with open(log_file, "ab") as log:
            log_start = log.seek(0, os.SEEK_END)
            process = subprocess.Popen(
                spec.wrap(argv) if spec.wrap else argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        started = Started(spec, process, ready, log_file, log_start=log_start)
        self.started.append(started)
        return started

    def wait_ready(self, group: list[Started]) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        for started in group:
            started.ports = self._await_ready_file(started, deadline)
            if started.spec.on_ready:
                started.spec.on_ready(started.ports)
            self._await_serving(started, deadline)

    def _await_ready_file(self, started: Started, deadline: float) -> dict[str, int]:
        while time.monotonic() < deadline:
            if started.process.poll() is not None:
                raise LaunchError(
                    f"{started.spec.name} exited with {started.process.returncode} during startup:\n"
                    f"{_log_tail(started.log_file)}"
                )
            if started.ready_file.exists():
                return json.loads(started.ready_file.read_text(encoding="utf-8"))
            time.sleep(0.05)
        raise LaunchError(f"{started.spec.name} did not report ready within {self.options.startup_timeout_s:.0f} s")

    def _await_serving(self, started: Started, deadline: float) -> None:
        address = f"{started.spec.host}:{started.ports['grpc']}"
        status = "UNREACHABLE"
        while time.monotonic() < deadline:
            status = check_health(address, credentials=self.trust.operator_credentials())
            if status == "SERVING":
                return
            time.sleep(0.1)
        raise LaunchError(f"{started.spec.name} at {address} is {status}, not SERVING")

    def stop_all(self) -> list[str]:
        return stop_processes([(s.spec.name, s.process.pid) for s in self.started], self.options.grace_period_s)


def _is_fleet_process(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"services." in cmdline


def _alive(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def stop_processes(targets: list[tuple[str, int]], grace_period_s: float) -> list[str]:
    """SIGTERM every fleet process, wait out the grace period, SIGKILL what is left.

    Returns the names that needed SIGKILL.
    """
    live = [(name, pid) for name, pid in targets if _alive(pid) and _is_fleet_process(pid)]
    for _, pid in live:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_period_s + 5.0
    while live and time.monotonic() < deadline:
        live = [(name, pid) for name, pid in live if _alive(pid)]
        time.sleep(0.05)
    for _, pid in live:
        os.kill(pid, signal.SIGKILL)
    return [name for name, _ in live]
