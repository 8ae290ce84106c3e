"""Artifacts over the network: the serving side's file lookup and chunking, and the receiving
side's content-addressed cache.

A stage worker never reads the builder's disk. It asks for the manifest, checks that it hashes
to the address it was told, then fetches every file the manifest lists, resuming a cut stream
from the bytes it already has. Each file is verified against the manifest's sha256 as it lands
and stored once under its own hash (`blobs/sha256-<hex>`); the artifact directory is then
assembled from hard links and verified in full before any stage loads it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from libs.artifacts.manifest import (
    MANIFEST_FILE,
    StageManifest,
    artifact_dir_name,
    decode_manifest,
    manifest_hash,
)
from libs.service.errors import DataLoss, InvalidArgument, NotFound

DEFAULT_CHUNK_BYTES = 1 << 20
MAX_CHUNK_BYTES = 4 << 20
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


class ArtifactTransferCorruptError(DataLoss):
    """Bytes arrived whose sha256 differs from the manifest's; they are discarded."""

    default_reason = "ARTIFACT_TRANSFER_CORRUPT"


class ArtifactTransferTruncatedError(DataLoss):
    """The stream ended before the file's last byte, after every resume was spent."""

    default_reason = "ARTIFACT_TRANSFER_TRUNCATED"


def require_manifest_hash(value: str, field: str = "manifest_hash") -> str:
    if not _HASH.match(value or ""):
        raise InvalidArgument(f"{field} must be 'sha256:' and 64 hex digits, got {value!r}", field=field)
    return value


# ---- serving side ---------------------------------------------------------------------------
def artifact_file(store_dir: Path, hash_value: str, path: str) -> Path:
    """The file `path` of the stored artifact `hash_value`; only the manifest and the files it
    lists can be asked for, so no request reaches outside the artifact."""
    require_manifest_hash(hash_value)
    root = store_dir / artifact_dir_name(hash_value)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise NotFound(f"no artifact {hash_value} in this builder's store", reason="ARTIFACT_NOT_FOUND")
    if path == MANIFEST_FILE:
        return manifest_path
    listed = {f.path for f in decode_manifest(manifest_path.read_bytes()).files}
    if path not in listed:
        raise NotFound(f"{path!r} is not a file of artifact {hash_value}", reason="ARTIFACT_FILE_NOT_LISTED",
                       field="path")
    return root / path


def read_chunks(path: Path, offset_bytes: int, max_chunk_bytes: int) -> Iterator[tuple[int, bytes, int]]:
    """(offset, data, file size) from `offset_bytes` to the end of the file."""
    chunk = min(max_chunk_bytes or DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES)
    size = path.stat().st_size
    if offset_bytes > size:
        raise InvalidArgument(f"offset {offset_bytes} is past the end of a {size}-byte file", field="offset_bytes")
    with open(path, "rb") as handle:
        handle.seek(offset_bytes)
        position = offset_bytes
        while position < size or position == offset_bytes == size:
            data = handle.read(chunk)
            yield position, data, size
            if not data:
                return
            position += len(data)


# ---- receiving side -------------------------------------------------------------------------
@dataclass(frozen=True)
class ArtifactCache:
    """A worker's private cache: `blobs/sha256-<hex>` per file, `artifacts/sha256-<manifest>`
    assembled from them, `partial/` for transfers under way."""

    root: Path

    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / f"sha256-{sha256}"

    def partial(self, sha256: str) -> Path:
        return self.root / "partial" / f"sha256-{sha256}"

    def artifact_dir(self, hash_value: str) -> Path:
        return self.root / "artifacts" / artifact_dir_name(hash_value)


def accept_manifest(raw: bytes, expected_hash: str) -> StageManifest:
    """The manifest, if and only if it hashes to the address it was fetched by."""
    manifest = decode_manifest(raw)
    actual = manifest_hash(manifest)
    if any(Path(record.path).name != record.path or record.path == MANIFEST_FILE for record in manifest.files):
        raise ArtifactTransferCorruptError("the manifest lists a file outside its directory", field="manifest")
    if actual != expected_hash:
        raise ArtifactTransferCorruptError(f"the manifest fetched for {expected_hash} hashes to {actual}",
                                           field="manifest")
    return manifest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(DEFAULT_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def seal_blob(cache: ArtifactCache, sha256: str, size_bytes: int) -> Path:
    """Move a complete partial file into the blob store after checking its size and sha256;
    a mismatch deletes it, so the next attempt starts from zero."""
    partial = cache.partial(sha256)
    actual_size = partial.stat().st_size
    actual = sha256_of(partial) if actual_size == size_bytes else None
    if actual != sha256:
        partial.unlink(missing_ok=True)
        raise ArtifactTransferCorruptError(
            f"received {actual_size} bytes hashing to {actual or '(size mismatch)'}; the manifest says "
            f"{size_bytes} bytes, sha256 {sha256}", field="data")
    blob = cache.blob(sha256)
    blob.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, blob)
    return blob


def assemble(cache: ArtifactCache, hash_value: str, manifest_raw: bytes, manifest: StageManifest) -> Path:
    """Hard-link the artifact's blobs into its directory (replacing any earlier attempt)."""
    final = cache.artifact_dir(hash_value)
    staging = final.with_name(final.name + ".assembling")
    if staging.exists():
        for child in staging.iterdir():
            child.unlink()
    staging.mkdir(parents=True, exist_ok=True)
    (staging / MANIFEST_FILE).write_bytes(manifest_raw)
    for record in manifest.files:
        os.link(cache.blob(record.sha256), staging / record.path)
    if final.exists():
        for child in final.iterdir():
            child.unlink()
        final.rmdir()
    os.replace(staging, final)
    return final
