"""`python -m services.evidence_registry` / `fornax-evidence-registry`."""

from __future__ import annotations

import sys

from libs.service.server import run_service
from services.evidence_registry.config import RegistryConfig
from services.evidence_registry.server import make_spec


def main(argv: list[str] | None = None) -> int:
    cfg = RegistryConfig.from_env(argv)
    return run_service(cfg.server, lambda: make_spec(cfg))


if __name__ == "__main__":
    sys.exit(main())
