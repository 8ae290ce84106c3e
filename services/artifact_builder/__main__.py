"""`python -m services.artifact_builder` / `fornax-artifact-builder`."""

from __future__ import annotations

import sys

from libs.service.server import run_service
from services.artifact_builder.config import BuilderConfig
from services.artifact_builder.server import make_spec


def main(argv: list[str] | None = None) -> int:
    cfg = BuilderConfig.from_env(argv)
    return run_service(cfg.server, lambda: make_spec(cfg))


if __name__ == "__main__":
    sys.exit(main())
