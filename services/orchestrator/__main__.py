"""`python -m services.orchestrator` / `fornax-orchestrator`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from libs.common.kinds import Backend
from libs.service.server import run_service
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.server import make_spec


def main(argv: list[str] | None = None) -> int:
    cfg = OrchestratorConfig.from_env(argv)
    if cfg.inprocess.checkpoint and cfg.inprocess.backend is Backend.MAX:
        from libs.model.max_kernels import configure_max_process, default_cache_dir

        cache_dir = Path(cfg.route.compile_cache_dir) if cfg.route.compile_cache_dir else default_cache_dir()
        configure_max_process(os.environ, cache_dir)
    return run_service(cfg.server, lambda: make_spec(cfg))


if __name__ == "__main__":
    sys.exit(main())
