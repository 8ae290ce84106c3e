"""Artifact builder settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.service.config import ServerConfig, parse, pick, server_config


@dataclass(frozen=True)
class BuilderConfig:
    server: ServerConfig
    artifact_store: str = ".fornax/artifacts"
    registry_addr: str | None = None

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> BuilderConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-artifact-builder", description="Fornax artifact builder")
        parser.add_argument("--artifact-store", help="artifact store directory (env FORNAX_ARTIFACT_STORE)")
        parser.add_argument("--registry-addr", help="evidence registry gRPC address (env FORNAX_REGISTRY_ADDR)")
        args = parse(parser, argv)
        return cls(
            server=server_config(args, env, "artifact_builder"),
            artifact_store=pick(args.artifact_store, env, "FORNAX_ARTIFACT_STORE", cls.artifact_store),
            registry_addr=pick(args.registry_addr, env, "FORNAX_REGISTRY_ADDR", None),
        )
