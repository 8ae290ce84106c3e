"""Fetch a stage artifact from the artifact builder into this worker's own cache.

Each file streams over `FetchArtifact`. A stream cut short resumes from the bytes already on
disk; bytes that do not hash to the manifest's sha256 are discarded and fetched again from
zero. After `attempts` tries the specific error stands (ARTIFACT_TRANSFER_TRUNCATED or
ARTIFACT_TRANSFER_CORRUPT). The assembled directory is verified in full before it is returned.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import structlog

from fornax.artifact_builder.v1 import artifact_builder_pb2 as ab_pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as ab_grpc
from libs.artifacts.errors import ARTIFACT_ERRORS
from libs.artifacts.manifest import MANIFEST_FILE, FileRecord
from libs.artifacts.transfer import (
    ArtifactCache,
    ArtifactTransferCorruptError,
    ArtifactTransferTruncatedError,
    accept_manifest,
    assemble,
    require_manifest_hash,
    seal_blob,
)
from libs.artifacts.verify import verify_artifact
from libs.service.channels import ChannelConfig, open_aio_channel

log = structlog.get_logger()
READS = ("fornax.artifact_builder.v1.ArtifactBuilderService/FetchArtifact",)
FETCH_ATTEMPTS = 4
# Per stream; a resume opens a new one.
STREAM_TIMEOUT_S = 600.0
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
             grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)


async def _stream_into(stub, hash_value: str, path: str, target: Path) -> int:
    """Append the file from where `target` ends; returns the size the server announced."""
    offset = target.stat().st_size if target.exists() else 0
    size = -1
    request = ab_pb.FetchArtifactRequest(manifest_hash=hash_value, path=path, offset_bytes=offset)
    with open(target, "ab") as handle:
        async for chunk in stub.FetchArtifact(request, timeout=STREAM_TIMEOUT_S):
            if chunk.offset_bytes != offset:
                raise ArtifactTransferCorruptError(
                    f"{path}: chunk at offset {chunk.offset_bytes}, expected {offset}", field="offset_bytes")
            await asyncio.to_thread(handle.write, chunk.data)  # the loop also serves the data plane
            offset += len(chunk.data)
            size = chunk.file_size_bytes
    return size


async def _fetch_file(stub, hash_value: str, record: FileRecord, cache: ArtifactCache, attempts: int) -> None:
    partial = cache.partial(record.sha256)
    partial.parent.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            await _stream_into(stub, hash_value, record.path, partial)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE:
                raise
            last = exc
        have = partial.stat().st_size if partial.exists() else 0
        if have < record.size_bytes:
            last = ArtifactTransferTruncatedError(
                f"{record.path}: {have} of {record.size_bytes} bytes after attempt {attempt}", field="data")
            log.warning("artifact_transfer_resume", path=record.path, have_bytes=have, attempt=attempt)
            continue
        try:
            await asyncio.to_thread(seal_blob, cache, record.sha256, record.size_bytes)
            return
        except ArtifactTransferCorruptError as exc:
            last = exc
            log.warning("artifact_transfer_corrupt", path=record.path, attempt=attempt, detail=exc.message)
    if isinstance(last, (ArtifactTransferCorruptError, ArtifactTransferTruncatedError)):
        raise last
    raise ArtifactTransferTruncatedError(f"{record.path}: the transfer kept failing: {last}", field="data")


async def _fetch_manifest(stub, hash_value: str, attempts: int) -> bytes:
    last: Exception | None = None
    for _ in range(attempts):
        try:
            raw = b"".join([c.data async for c in stub.FetchArtifact(
                ab_pb.FetchArtifactRequest(manifest_hash=hash_value, path=MANIFEST_FILE), timeout=STREAM_TIMEOUT_S)])
            accept_manifest(raw, hash_value)
            return raw
        except ArtifactTransferCorruptError as exc:
            last = exc
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE:
                raise
            last = exc
    if isinstance(last, ArtifactTransferCorruptError):
        raise last
    raise ArtifactTransferTruncatedError(f"the manifest transfer kept failing: {last}", field="manifest")


def _verified(directory: Path, hash_value: str) -> bool:
    try:
        verify_artifact(directory, expected_manifest_hash=hash_value)
        return True
    except ARTIFACT_ERRORS:
        return False


async def fetch_artifact(address: str, hash_value: str, cache: ArtifactCache,
                         attempts: int = FETCH_ATTEMPTS, config: ChannelConfig = ChannelConfig()) -> Path:
    """The verified local directory of artifact `hash_value`, fetched from `address` if needed."""
    require_manifest_hash(hash_value, "spec.manifest_hash")
    final = cache.artifact_dir(hash_value)
    if final.exists() and await asyncio.to_thread(_verified, final, hash_value):
        log.info("artifact_cache_hit", manifest_hash=hash_value)
        return final
    async with open_aio_channel(address, config, idempotent=READS) as channel:
        stub = ab_grpc.ArtifactBuilderServiceStub(channel)
        raw = await _fetch_manifest(stub, hash_value, attempts)
        manifest = accept_manifest(raw, hash_value)
        for record in manifest.files:
            if not cache.blob(record.sha256).exists():
                await _fetch_file(stub, hash_value, record, cache, attempts)
    directory = await asyncio.to_thread(assemble, cache, hash_value, raw, manifest)
    # The whole artifact again, as loading would: sizes, hashes, safetensors layout.
    await asyncio.to_thread(verify_artifact, directory, expected_manifest_hash=hash_value)
    log.info("artifact_fetched", manifest_hash=hash_value, files=len(manifest.files), source=address)
    return directory
