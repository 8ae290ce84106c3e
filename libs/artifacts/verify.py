"""Verify a stage artifact directory by hashing everything again.

Stage workers call `verify_artifact` before loading and refuse the artifact on any error. The
checks run in a fixed order so that each kind of damage gets its own reason code:

1. manifest present and well-formed            ARTIFACT_MANIFEST_MISSING / _INVALID
2. manifest hash equals the content address
   and the expected hash                       ARTIFACT_MANIFEST_HASH_MISMATCH
3. plan hash equals the expected plan          ARTIFACT_PLAN_MISMATCH
4. every listed file present, nothing extra    ARTIFACT_FILE_MISSING / ARTIFACT_LAYOUT_MISMATCH
5. sizes: shorter is a truncation              ARTIFACT_TRUNCATED / ARTIFACT_SIZE_MISMATCH
6. sha256 of every file                        ARTIFACT_CHECKSUM_MISMATCH
7. the safetensors header agrees with the
   manifest's tensor table, and each tensor's
   weight format (stored shape, the file's
   format table) with its manifest record      ARTIFACT_LAYOUT_MISMATCH
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from libs.artifacts.errors import (
    ArtifactChecksumMismatchError,
    ArtifactFileMissingError,
    ArtifactLayoutMismatchError,
    ArtifactSizeMismatchError,
    ArtifactTruncatedError,
    ManifestHashMismatchError,
    ManifestMissingError,
    PlanMismatchError,
)
from libs.artifacts.manifest import (
    MANIFEST_FILE,
    StageManifest,
    decode_manifest,
    hash_from_dir_name,
    manifest_hash,
)
from libs.artifacts.safetensors_format import read_header
from libs.service.errors import FornaxError

HASH_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class VerifiedArtifact:
    """An artifact whose every byte matched its manifest at verification time."""

    artifact_dir: Path
    manifest: StageManifest
    manifest_hash: str


def sha256_file(path: str | os.PathLike[str], chunk_bytes: int = HASH_CHUNK_BYTES) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def verify_artifact(
    artifact_dir: str | os.PathLike[str],
    expected_manifest_hash: str | None = None,
    expected_plan_hash: str | None = None,
) -> VerifiedArtifact:
    """Return the verified manifest, or raise the artifact error naming the first defect.

    An empty or None expectation is not checked. A content-addressed directory ("sha256-<hex>", also
    reached through a symlink) is always checked against its own name.
    """
    root = Path(artifact_dir).resolve()
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ManifestMissingError(f"{root}: no {MANIFEST_FILE}")
    manifest = decode_manifest(manifest_path.read_bytes())
    actual_hash = manifest_hash(manifest)
    _check_manifest_hash(root, actual_hash, expected_manifest_hash)
    if expected_plan_hash and manifest.plan.plan_hash != expected_plan_hash:
        raise PlanMismatchError(
            f"{root}: built for plan {manifest.plan.plan_id!r} {manifest.plan.plan_hash}, "
            f"expected plan hash {expected_plan_hash}"
        )
    _check_file_set(root, manifest)
    for record in manifest.files:
        _check_file(root, record.path, record.size_bytes, record.sha256)
    _check_tensor_table(root, manifest)
    return VerifiedArtifact(artifact_dir=root, manifest=manifest, manifest_hash=actual_hash)


def _check_manifest_hash(root: Path, actual: str, expected: str | None) -> None:
    addressed = hash_from_dir_name(root.name)
    if addressed is not None and addressed != actual:
        raise ManifestHashMismatchError(f"{root}: manifest hashes to {actual}, directory names {addressed}")
    if expected and expected != actual:
        raise ManifestHashMismatchError(f"{root}: manifest hashes to {actual}, expected {expected}")


def _check_file_set(root: Path, manifest: StageManifest) -> None:
    listed = {r.path for r in manifest.files}
    present = {p.name for p in root.iterdir()} - {MANIFEST_FILE}
    if missing := sorted(listed - present):
        raise ArtifactFileMissingError(f"{root}: listed files {missing} are missing")
    if unlisted := sorted(present - listed):
        raise ArtifactLayoutMismatchError(f"{root}: unlisted files {unlisted} in the artifact")
    for tensor in manifest.tensors:
        if tensor.file not in listed:
            raise ArtifactLayoutMismatchError(f"tensor {tensor.name!r} names unlisted file {tensor.file!r}")


def _check_file(root: Path, name: str, size_bytes: int, sha256: str) -> None:
    path = root / name
    if not path.is_file():
        raise ArtifactFileMissingError(f"{path}: not a regular file")
    actual_size = path.stat().st_size
    if actual_size < size_bytes:
        raise ArtifactTruncatedError(f"{path}: {actual_size} bytes, manifest says {size_bytes}")
    if actual_size > size_bytes:
        raise ArtifactSizeMismatchError(f"{path}: {actual_size} bytes, manifest says {size_bytes}")
    actual_sha = sha256_file(path)
    if actual_sha != sha256:
        raise ArtifactChecksumMismatchError(f"{path}: sha256 {actual_sha}, manifest says {sha256}")


def _check_tensor_table(root: Path, manifest: StageManifest) -> None:
    by_file: dict[str, dict[str, tuple]] = {}
    for t in manifest.tensors:
        by_file.setdefault(t.file, {})[t.name] = (t.dtype, tuple(t.shape), t.data_begin, t.data_end)
    for name, expected in sorted(by_file.items()):
        try:
            header = read_header(root / name)
        except FornaxError as exc:
            raise ArtifactLayoutMismatchError(f"{root / name}: {exc.message}") from exc
        found = {t.name: (t.dtype, t.shape, t.data_begin, t.data_end) for t in header.tensors}
        if found != expected:
            differing = sorted(set(found.items()) ^ set(expected.items()))[:3]
            raise ArtifactLayoutMismatchError(f"{root / name}: header disagrees with manifest: {differing}")
        _check_formats(root / name, dict(header.metadata), [t for t in manifest.tensors if t.file == name])


def _check_formats(path: Path, metadata: dict[str, str], tensors: list) -> None:
    """Each tensor's stored entry holds its recorded format, and the file's format table (what
    the loader reads) names exactly the manifest's non-float32 formats."""
    from libs.weights.codecs import stored_shape
    from libs.weights.formats import FORMATS
    from libs.weights.metadata import decode_formats

    try:
        table = decode_formats(metadata)
    except FornaxError as exc:
        raise ArtifactLayoutMismatchError(f"{path}: {exc.message}") from exc
    recorded = {}
    for t in tensors:
        wf = t.weight_format
        fmt = FORMATS.get(wf.format)
        if fmt is None or tuple(t.shape) != stored_shape(fmt, tuple(wf.logical_shape)):
            raise ArtifactLayoutMismatchError(
                f"{path}: tensor {t.name!r} stored as {t.dtype}{list(t.shape)} cannot hold "
                f"{wf.format}{list(wf.logical_shape)}")
        if wf.format != "fp32":
            recorded[t.name] = (wf.format, tuple(wf.logical_shape))
    if table != recorded:
        differing = sorted(set(table.items()) ^ set(recorded.items()))[:3]
        raise ArtifactLayoutMismatchError(f"{path}: the file's weight formats disagree with the manifest: {differing}")
