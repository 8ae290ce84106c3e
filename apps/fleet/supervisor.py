"""Restarts a local fleet's stage workers (and, kept by `fornax up`, its orchestrator) when
they die, on the same ports.

The orchestrator notices the restarted worker (reachable, no stage loaded), reloads the
stored plan on every stage as a new generation and replays the requests the failure hit.
Same ports, so the orchestrator's configured addresses stay valid. A restarted orchestrator
serves the replica routes its state directory committed last (services/orchestrator/resume_setup.py),
on the same gRPC, metrics and HTTP ports, so `fleet.json` and the API address stay valid.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from apps.fleet.launcher import Launcher, LaunchError, Started

_log = structlog.get_logger()
PORT_ENV = {"grpc": "FORNAX_GRPC_PORT", "metrics": "FORNAX_METRICS_PORT",
            "data_plane": "FORNAX_DATA_PLANE_PORT", "http": "FORNAX_HTTP_PORT"}
# What `fornax up` keeps: a crashed stage worker or orchestrator is started again.
KEPT_KINDS = frozenset({"stage_worker", "orchestrator"})


class FleetSupervisor:
    def __init__(self, launcher: Launcher, kinds: frozenset[str] = frozenset({"stage_worker"}),
                 poll_s: float = 0.2, on_restart: Callable[[], None] | None = None,
                 keep_down: Callable[[], frozenset[str]] = frozenset) -> None:
        self._launcher = launcher
        # The services taken out on purpose (`fornax host drain`): never restarted.
        self._keep_down = keep_down
        self._on_restart = on_restart
        self._kinds = kinds
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-supervisor", daemon=True)
        self.restarts: list[tuple[str, float]] = []  # (service, monotonic time it was back)

    def start(self) -> FleetSupervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            for started in list(self._launcher.started):
                if started.spec.kind in self._kinds and started.process.poll() is not None \
                        and started.spec.name in self._keep_down():
                    self._launcher.started.remove(started)
                    _log.info("worker_retired", service=started.spec.name, exit_code=started.process.returncode)
                elif started.spec.kind in self._kinds and crashed(started.process.poll()):
                    try:
                        self._restart(started)
                    except OSError as exc:  # could not even spawn: keep supervising the rest
                        _log.error("worker_restart_failed", service=started.spec.name, error=str(exc))

    def _restart(self, dead: Started) -> None:
        _log.warning("worker_died", service=dead.spec.name, exit_code=dead.process.returncode)
        pinned = {PORT_ENV[k]: str(v) for k, v in dead.ports.items() if k in PORT_ENV}
        spec = replace(dead.spec, env={**dead.spec.env, **pinned})
        self._launcher.started.remove(dead)
        fresh = self._launcher.spawn(spec)
        try:
            self._launcher.wait_ready([fresh])
        except (LaunchError, OSError) as exc:  # the next poll tries again, on the same ports
            fresh.ports = dead.ports
            _log.error("worker_restart_failed", service=dead.spec.name, error=str(exc)[:300])
            return
        self.restarts.append((spec.name, time.monotonic()))
        _log.info("worker_restarted", service=spec.name, pid=fresh.process.pid)
        if self._on_restart is not None:
            self._on_restart()  # e.g. record the new pid where `fornax down` finds it


def crashed(returncode: int | None) -> bool:
    """Died, as opposed to running or stopped on purpose (`fornax down` sends SIGTERM, and a
    worker that drains and exits 0 is not to be brought back)."""
    return returncode is not None and returncode not in (0, -signal.SIGTERM, -signal.SIGINT)
