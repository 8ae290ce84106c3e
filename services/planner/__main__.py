"""`python -m services.planner` / `fornax-planner`."""

from __future__ import annotations

import sys

from libs.service.server import run_service
from services.planner.config import PlannerConfig
from services.planner.server import make_spec


def main(argv: list[str] | None = None) -> int:
    cfg = PlannerConfig.from_env(argv)
    return run_service(cfg.server, lambda: make_spec(cfg))


if __name__ == "__main__":
    sys.exit(main())
