"""`python -m services.orchestrator` / `fornax-orchestrator`."""

from __future__ import annotations

import sys

from libs.service.server import run_service
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.server import make_spec


def main(argv: list[str] | None = None) -> int:
    cfg = OrchestratorConfig.from_env(argv)
    return run_service(cfg.server, lambda: make_spec(cfg))


if __name__ == "__main__":
    sys.exit(main())
