"""Evidence registry settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.service.config import ServerConfig, parse, pick, server_config


@dataclass(frozen=True)
class RegistryConfig:
    server: ServerConfig
    db_path: str = ".fornax/registry/registry.db"
    blob_dir: str = ".fornax/registry/blobs"

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> RegistryConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-evidence-registry", description="Fornax evidence registry")
        parser.add_argument("--db", help="SQLite database path (env FORNAX_REGISTRY_DB)")
        parser.add_argument("--blob-dir", help="content-addressed blob directory (env FORNAX_REGISTRY_BLOB_DIR)")
        args = parse(parser, argv)
        return cls(
            server=server_config(args, env, "evidence_registry"),
            db_path=pick(args.db, env, "FORNAX_REGISTRY_DB", cls.db_path),
            blob_dir=pick(args.blob_dir, env, "FORNAX_REGISTRY_BLOB_DIR", cls.blob_dir),
        )
