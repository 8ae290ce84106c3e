"""Artifact builder settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.security.paths import parse_roots
from libs.service.config import ServerConfig, parse, pick, server_config

DEFAULT_BUILD_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class BuilderConfig:
    server: ServerConfig
    # Default build output directory when a request names none.
    artifact_store: str = ".fornax/artifacts"
    # Evidence registry address; when set, inspected snapshots are registered as model records.
    registry_addr: str | None = None
    # Largest read while streaming tensor bytes; bounds the build's memory.
    build_chunk_bytes: int = DEFAULT_BUILD_CHUNK_BYTES
    # Where checkpoints may be read from (the artifact store is always readable); empty = none.
    read_roots: tuple[Path, ...] = ()

    @property
    def write_roots(self) -> tuple[Path, ...]:
        return (Path(self.artifact_store).resolve(),)

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> BuilderConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-artifact-builder", description="Fornax artifact builder")
        parser.add_argument("--artifact-store", help="artifact store directory (env FORNAX_ARTIFACT_STORE)")
        parser.add_argument("--registry-addr", help="evidence registry gRPC address (env FORNAX_REGISTRY_ADDR)")
        parser.add_argument("--build-chunk-bytes", type=int, help="streaming copy chunk (env FORNAX_BUILD_CHUNK_BYTES)")
        parser.add_argument(
            "--read-roots", help=f"checkpoint directories, {os.pathsep!r}-separated (env FORNAX_READ_ROOTS)"
        )
        args = parse(parser, argv)
        chunk = pick(args.build_chunk_bytes, env, "FORNAX_BUILD_CHUNK_BYTES", DEFAULT_BUILD_CHUNK_BYTES, int)
        if chunk <= 0:
            raise SystemExit(f"build chunk bytes must be positive, got {chunk}")
        return cls(
            server=server_config(args, env, "artifact_builder"),
            artifact_store=pick(args.artifact_store, env, "FORNAX_ARTIFACT_STORE", cls.artifact_store),
            registry_addr=pick(args.registry_addr, env, "FORNAX_REGISTRY_ADDR", None),
            build_chunk_bytes=chunk,
            read_roots=parse_roots(pick(args.read_roots, env, "FORNAX_READ_ROOTS", "")),
        )
