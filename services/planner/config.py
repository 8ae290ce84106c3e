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
    plan_store_capacity: int = 1024

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> PlannerConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-planner", description="Fornax planner service")
        parser.add_argument("--registry-addr", help="evidence registry gRPC address (env FORNAX_REGISTRY_ADDR)")
        parser.add_argument("--plan-store-capacity", type=int,
                            help="issued plans kept for GetPlan (env FORNAX_PLAN_STORE_CAPACITY)")
        args = parse(parser, argv)
        capacity = pick(args.plan_store_capacity, env, "FORNAX_PLAN_STORE_CAPACITY", 1024, int)
        if capacity < 1:
            raise SystemExit(f"plan store capacity must be >= 1, got {capacity}")
        return cls(
            server=server_config(args, env, "planner"),
            registry_addr=pick(args.registry_addr, env, "FORNAX_REGISTRY_ADDR", None),
            plan_store_capacity=capacity,
        )
