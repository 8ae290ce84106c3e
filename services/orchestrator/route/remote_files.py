"""What the orchestrator knows of the model, fetched from the artifact builder over gRPC.

The builder is the only service that reads the checkpoint. The orchestrator asks it for the
small model files (config, tokenizer, tokenizer config and chat template, weight index), checks
every file against the sha256 sent with it and against the snapshot's tokenizer and template
hashes, and keeps them in its own state directory. Stage manifests come over `FetchArtifact`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fornax.artifact_builder.v1 import artifact_builder_pb2 as ab_pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as ab_grpc
from libs.artifacts.manifest import MANIFEST_FILE, StageManifest
from libs.artifacts.transfer import accept_manifest
from libs.service.channels import ChannelConfig, open_aio_channel
from libs.service.errors import DataLoss, FailedPrecondition
from libs.text.context import TextPins

MODEL_FILES_TIMEOUT_S = 120.0
READS = ("fornax.artifact_builder.v1.ArtifactBuilderService/FetchArtifact",
         "fornax.artifact_builder.v1.ArtifactBuilderService/GetModelFiles")


class ModelFileHashMismatch(DataLoss):
    default_reason = "MODEL_FILE_HASH_MISMATCH"


def _check(reply: ab_pb.GetModelFilesResponse) -> None:
    for item in reply.files:
        if Path(item.path).name != item.path:
            raise ModelFileHashMismatch(f"the builder sent a file outside the model directory: {item.path!r}")
        actual = hashlib.sha256(item.content).hexdigest()
        if actual != item.sha256:
            raise ModelFileHashMismatch(f"{item.path} hashes to {actual}, the builder says {item.sha256}",
                                        field=item.path)
    by_name = {item.path: item.sha256 for item in reply.files}
    if by_name.get("tokenizer.json") != reply.snapshot.tokenizer_sha256:
        raise ModelFileHashMismatch("tokenizer.json does not match the snapshot's tokenizer_sha256",
                                    field="tokenizer.json")
    if by_name.get("config.json") != reply.snapshot.config_sha256:
        raise ModelFileHashMismatch("config.json does not match the snapshot's config_sha256", field="config.json")


def write_model_files(reply: ab_pb.GetModelFilesResponse, state_dir: Path) -> Path:
    """Store checked files under `<state>/models/<snapshot>`; returns that directory."""
    _check(reply)
    target = state_dir / "models" / reply.snapshot.snapshot_id.replace(":", "-")
    staging = target.with_name(target.name + f".{os.getpid()}.tmp")
    staging.mkdir(parents=True, exist_ok=True)
    for item in reply.files:
        (staging / item.path).write_bytes(item.content)
    if target.exists():
        for child in target.iterdir():
            child.unlink()
        target.rmdir()
    os.replace(staging, target)
    return target


async def fetch_model_files(builder: str, checkpoint_dir: str, state_dir: Path,
                            config: ChannelConfig = ChannelConfig()) -> tuple[Path, TextPins]:
    async with open_aio_channel(builder, config, idempotent=READS) as channel:
        reply = await ab_grpc.ArtifactBuilderServiceStub(channel).GetModelFiles(
            ab_pb.GetModelFilesRequest(checkpoint_dir=checkpoint_dir), timeout=MODEL_FILES_TIMEOUT_S)
    local = write_model_files(reply, state_dir)
    return local, TextPins(tokenizer_sha256=reply.snapshot.tokenizer_sha256,
                           template_sha256=reply.snapshot.chat_template_sha256)


async def fetch_manifest(builder: str, manifest_hash: str, config: ChannelConfig = ChannelConfig()) -> StageManifest:
    async with open_aio_channel(builder, config, idempotent=READS) as channel:
        stream = ab_grpc.ArtifactBuilderServiceStub(channel).FetchArtifact(
            ab_pb.FetchArtifactRequest(manifest_hash=manifest_hash, path=MANIFEST_FILE), timeout=MODEL_FILES_TIMEOUT_S)
        raw = b"".join([chunk.data async for chunk in stream])
    return accept_manifest(raw, manifest_hash)


def check_text_pins(manifests: list[StageManifest], pins: TextPins) -> None:
    """Every stage was built from the tokenizer and template the orchestrator tokenizes with."""
    seen = {(m.source.tokenizer_sha256, m.source.chat_template_sha256) for m in manifests}
    expected = (pins.tokenizer_sha256, pins.template_sha256)
    if seen != {expected}:
        raise FailedPrecondition(f"stage manifests name tokenizer/template {sorted(seen)}, the model files "
                                 f"{expected}", reason="TEXT_IDENTITY_MISMATCH")
