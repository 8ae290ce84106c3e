"""`python -m services.stage_worker` / `fornax-stage-worker`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from libs.common.kinds import Backend
from libs.service.server import run_service
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.server import make_spec


def main(argv: list[str] | None = None) -> int:
    cfg = StageWorkerConfig.from_env(argv)
    if cfg.cpu_affinity:
        os.sched_setaffinity(0, cfg.cpu_affinity)
    _fit_affinity_to_quota()
    if cfg.backend is Backend.MAX:
        from libs.model.max_kernels import configure_max_process, default_cache_dir

        cache_dir = Path(cfg.compile_cache_dir) if cfg.compile_cache_dir else default_cache_dir()
        configure_max_process(os.environ, cache_dir)
    return run_service(cfg.server, lambda: make_spec(cfg))


def _fit_affinity_to_quota() -> None:
    """Before MAX sizes its thread pool from the affinity mask: no more CPUs than the quota."""
    from libs.service.affinity import quota_cpus, usable_cpus
    from libs.service.cgroup_facts import cgroup_facts

    cpus = usable_cpus()
    fitted = quota_cpus(cpus, cgroup_facts().cpu_quota_cores)
    if fitted != cpus:
        os.sched_setaffinity(0, fitted)


if __name__ == "__main__":
    sys.exit(main())
