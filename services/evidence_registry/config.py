"""Evidence registry settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from libs.service.channels import MAX_MESSAGE_BYTES
from libs.service.config import ServerConfig, parse, pick, server_config

DEFAULT_MAX_BLOB_BYTES = 32 << 20
# A blob travels inside one gRPC message, so it must leave room for the record's metadata.
LARGEST_MAX_BLOB_BYTES = MAX_MESSAGE_BYTES * 3 // 4


@dataclass(frozen=True)
class RegistryConfig:
    server: ServerConfig
    db_path: str = ".fornax/registry/registry.db"
    blob_dir: str = ".fornax/registry/blobs"
    # At most LARGEST_MAX_BLOB_BYTES: servers and clients share one gRPC message limit.
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    sqlite_busy_timeout_ms: int = 30_000
    # Fleet CA that physical records' signers must chain to; defaults to the TLS CA.
    evidence_ca: str | None = None

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> RegistryConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-evidence-registry", description="Fornax evidence registry")
        parser.add_argument("--db", help="SQLite database path (env FORNAX_REGISTRY_DB)")
        parser.add_argument("--blob-dir", help="content-addressed blob directory (env FORNAX_REGISTRY_BLOB_DIR)")
        parser.add_argument("--max-blob-bytes", type=int,
                            help="largest accepted blob (env FORNAX_REGISTRY_MAX_BLOB_BYTES)")
        parser.add_argument(
            "--evidence-ca", help="CA that signs measuring identities (env FORNAX_EVIDENCE_CA; default the TLS CA)"
        )
        args = parse(parser, argv)
        max_blob_bytes = pick(args.max_blob_bytes, env, "FORNAX_REGISTRY_MAX_BLOB_BYTES", DEFAULT_MAX_BLOB_BYTES, int)
        if not 0 < max_blob_bytes <= LARGEST_MAX_BLOB_BYTES:
            raise SystemExit(f"max blob bytes must be in (0, {LARGEST_MAX_BLOB_BYTES}], got {max_blob_bytes}")
        server = server_config(args, env, "evidence_registry")
        evidence_ca = pick(args.evidence_ca, env, "FORNAX_EVIDENCE_CA", None)
        return cls(
            server=server,
            evidence_ca=evidence_ca or (str(server.tls.ca) if server.tls else None),
            db_path=pick(args.db, env, "FORNAX_REGISTRY_DB", cls.db_path),
            blob_dir=pick(args.blob_dir, env, "FORNAX_REGISTRY_BLOB_DIR", cls.blob_dir),
            max_blob_bytes=max_blob_bytes,
            sqlite_busy_timeout_ms=pick(None, env, "FORNAX_REGISTRY_BUSY_TIMEOUT_MS", 30_000, int),
        )
