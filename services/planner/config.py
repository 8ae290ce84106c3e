"""Planner settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.service.config import ServerConfig, parse, pick, server_config


@dataclass(frozen=True)
class PlannerConfig:
    server: ServerConfig
    registry_addr: str | None = None

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> PlannerConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-planner", description="Fornax planner service")
        parser.add_argument("--registry-addr", help="evidence registry gRPC address (env FORNAX_REGISTRY_ADDR)")
        args = parse(parser, argv)
        return cls(
            server=server_config(args, env, "planner"),
            registry_addr=pick(args.registry_addr, env, "FORNAX_REGISTRY_ADDR", None),
        )
