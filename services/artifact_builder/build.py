"""Write one content-addressed artifact per stage, streaming tensor bytes from the shards.

Store layout under `out_dir` (stated once, relied on by `fornax artifacts verify`):

    out_dir/artifacts/sha256-<manifest hex>/   one immutable artifact, named by its manifest hash
        model.safetensors                      only this stage's tensors, sorted by name
        config.json                            byte copy of the checkpoint's config
        tokenizer.json                         final stage only: byte copy of the tokenizer
        manifest.json                          the stage manifest
    out_dir/stage-<i> -> artifacts/sha256-<hex>   relative symlink per stage of the latest build

Tensor bytes are copied by byte range (seek + bounded reads), so memory stays bounded by the
chunk size whatever the shard size. The output header is written by hand in a fixed order, and
the manifest holds no paths or clocks, so identical inputs give byte-identical artifacts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from libs.artifacts.errors import ARTIFACT_ERRORS
from libs.artifacts.manifest import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    WEIGHTS_FILE,
    BoundarySide,
    FileRecord,
    LayerSpan,
    ManifestTensor,
    PlanRef,
    SourceLineage,
    StageManifest,
    artifact_dir_name,
    encode_manifest,
    manifest_hash,
)
from libs.artifacts.safetensors_format import encode_header, layout_tensors
from libs.artifacts.verify import sha256_file, verify_artifact
from libs.common.kinds import FLOAT_DTYPES, DType
from libs.common.proto import dtype_pb_name
from libs.model.config import DeepseekV2Config
from libs.weights.metadata import FORMATS_METADATA_KEY, encode_formats
from libs.weights.policy import DEFAULT_POLICY, SOURCE_POLICY, require_policy
from services.artifact_builder.durable import durable_rename, fsync_dir, sweep_stale_temps, temp_stage_prefix
from services.artifact_builder.encode_weights import EncodedTensor, choose_formats, write_tensor
from services.artifact_builder.errors import CheckpointChangedError, OutputDirError, PlanInvalidError
from services.artifact_builder.snapshot import TOKENIZER_FILE, CheckpointSnapshot, Inspection, shard_stat
from services.artifact_builder.staging import StageContents, StagePlan, assign_tensors

STORE_DIR = "artifacts"
STAGE_LINK_PREFIX = "stage-"
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
SAFETENSORS_METADATA = {"format": "pt"}


@dataclass(frozen=True)
class BuildProgress:
    """Build-wide counters; `stage_index` is the stage being written."""

    stage_index: int
    tensors_done: int
    tensors_total: int
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True)
class BuiltStage:
    stage_index: int
    artifact_dir: Path  # the content-addressed directory
    manifest_hash: str
    layer_start: int
    layer_end: int
    weight_bytes: int


@dataclass(frozen=True)
class BuildResult:
    plan_id: str
    plan_hash: str
    stages: tuple[BuiltStage, ...]


@dataclass(frozen=True)
class BuildOptions:
    out_dir: Path
    boundary_dtype: DType  # one of FLOAT_DTYPES
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # Per hop (hop i carries stage i's output to stage i+1); empty = boundary_dtype everywhere.
    hop_dtypes: tuple[DType, ...] = ()
    # The weight policy (`libs.weights.policy`), or one per stage (a mixed fleet).
    weights_policy: str = DEFAULT_POLICY
    stage_policies: tuple[str, ...] = ()
    # The backend each stage runs on ("max" holds only formats MAX runs); empty = numpy everywhere.
    stage_backends: tuple[str, ...] = ()

    def stage_policy(self, stage_index: int) -> str:
        return self.stage_policies[stage_index] if self.stage_policies else self.weights_policy

    def stage_backend(self, stage_index: int) -> str:
        return self.stage_backends[stage_index] if self.stage_backends else "numpy"

    def stage_dtypes(self, stage_index: int) -> tuple[DType, DType]:
        """(input, output) boundary dtypes of a stage; the ends of the route ignore theirs."""
        if not self.hop_dtypes:
            return self.boundary_dtype, self.boundary_dtype
        hops = self.hop_dtypes
        incoming = hops[stage_index - 1] if stage_index > 0 else hops[0]
        outgoing = hops[stage_index] if stage_index < len(hops) else hops[-1]
        return incoming, outgoing


def build_stage_artifacts(
    inspection: Inspection, plan: StagePlan, options: BuildOptions
) -> Iterator[BuildProgress | BuildResult]:
    """Yield progress after every tensor, then one BuildResult."""
    inspection.require_valid()
    if options.boundary_dtype not in FLOAT_DTYPES:
        raise PlanInvalidError(f"boundary dtype '{options.boundary_dtype}' not one of {', '.join(FLOAT_DTYPES)}",
                               field="boundary_dtype")
    if options.chunk_bytes <= 0:
        raise PlanInvalidError("chunk_bytes must be positive", field="chunk_bytes")
    if options.hop_dtypes and (len(options.hop_dtypes) != len(plan.stages) - 1
                               or not set(options.hop_dtypes) <= set(FLOAT_DTYPES)):
        raise PlanInvalidError(f"{len(plan.stages)} stages need {len(plan.stages) - 1} hop dtypes from "
                               f"{', '.join(FLOAT_DTYPES)}, got {', '.join(options.hop_dtypes)}",
                               field="hop_boundary_dtypes")
    if options.stage_policies and len(options.stage_policies) != len(plan.stages):
        raise PlanInvalidError(f"{len(plan.stages)} stages need {len(plan.stages)} weight policies, "
                               f"got {len(options.stage_policies)}", field="stage_weights_policies")
    for policy in {options.weights_policy, *options.stage_policies}:
        require_policy(policy)
    policies = _stage_policies(inspection, options, len(plan.stages))
    if options.stage_backends and len(options.stage_backends) != len(plan.stages):
        raise PlanInvalidError(f"{len(plan.stages)} stages need {len(plan.stages)} backends, "
                               f"got {len(options.stage_backends)}", field="plan.stages.backend")
    contents = assign_tensors(inspection.config, plan, inspection.by_name())
    layers = inspection.config.num_hidden_layers
    encoded = [choose_formats(c.tensors, policies[c.stage.stage_index], layers,
                              options.stage_backend(c.stage.stage_index)) for c in contents]
    store = _prepare_store(options.out_dir)
    counter = _Counter(
        tensors_total=sum(len(c.tensors) for c in contents),
        bytes_total=sum(t.nbytes() for stage in encoded for t in stage),
    )
    built = []
    for stage, tensors in zip(contents, encoded, strict=True):
        tmp = Path(tempfile.mkdtemp(prefix=temp_stage_prefix(stage.stage.stage_index), dir=store))
        try:
            weights = yield from _write_weights(
                inspection.snapshot, stage, tensors, tmp / WEIGHTS_FILE, options.chunk_bytes, counter
            )
            _require_unchanged(inspection)
            manifest = _manifest(inspection, plan, stage, tensors, tmp, weights,
                                 options.stage_dtypes(stage.stage.stage_index),
                                 policies[stage.stage.stage_index])
            built.append(_commit(store, tmp, manifest, stage))
        finally:
            # Also runs when the consumer abandons the build (generator closed mid-stage).
            shutil.rmtree(tmp, ignore_errors=True)
    _link_stages(options.out_dir, built)
    yield BuildResult(plan_id=plan.plan_id, plan_hash=plan.plan_hash, stages=tuple(built))


def _stage_policies(inspection: Inspection, options: BuildOptions, stages: int) -> list[str]:
    """Each stage's weight policy; a GGUF's tensors keep their stored formats (SOURCE_POLICY),
    and asking it for another policy is refused rather than re-quantizing the file."""
    asked = [options.stage_policy(i) for i in range(stages)]
    if inspection.source_format != "gguf":
        return asked
    if any(p != DEFAULT_POLICY for p in asked):
        raise PlanInvalidError(f"a GGUF keeps the formats it stores; weight policy {sorted(set(asked))} cannot "
                               "apply to it (build without --weights)", field="weights_policy",
                               reason="GGUF_WEIGHTS_POLICY")
    return [SOURCE_POLICY] * stages


def _require_unchanged(inspection: Inspection) -> None:
    """The copied bytes must be the hashed bytes: refuse shards touched since inspection."""
    names = [name for name, _, _ in inspection.shard_stats]
    now = shard_stat(inspection.snapshot.checkpoint_dir, names)
    if now != inspection.shard_stats:
        changed = [a[0] for a, b in zip(inspection.shard_stats, now, strict=False) if a != b]
        raise CheckpointChangedError(f"shards changed since inspection: {changed}")


class _Counter:
    def __init__(self, tensors_total: int, bytes_total: int) -> None:
        self.tensors_total, self.bytes_total = tensors_total, bytes_total
        self.tensors_done = self.bytes_done = 0

    def advance(self, stage_index: int, nbytes: int) -> BuildProgress:
        self.tensors_done += 1
        self.bytes_done += nbytes
        return BuildProgress(stage_index, self.tensors_done, self.tensors_total, self.bytes_done, self.bytes_total)


def _prepare_store(out_dir: Path) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputDirError(f"{out_dir} exists and is not a directory", field="out_dir")
    store = out_dir / STORE_DIR
    store.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(store, out_dir)
    for entry in stage_links(out_dir):
        if not entry.is_symlink():
            raise OutputDirError(f"{entry} exists and is not a stage link", field="out_dir")
    return store


class _HashingWriter:
    """Writes to a file while hashing exactly the bytes written."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.digest, self.size_bytes = fh, hashlib.sha256(), 0

    def write(self, chunk: bytes) -> None:
        self.fh.write(chunk)
        self.digest.update(chunk)
        self.size_bytes += len(chunk)


def weights_metadata(tensors: tuple[EncodedTensor, ...]) -> dict[str, str]:
    """The file's `__metadata__`: every tensor not stored as plain float32, with its format."""
    formats = {t.owned.name: (t.fmt.name, t.owned.source.shape) for t in tensors if t.fmt.name != "fp32"}
    return {**SAFETENSORS_METADATA, FORMATS_METADATA_KEY: encode_formats(formats)} if formats else SAFETENSORS_METADATA


def _write_weights(
    snapshot: CheckpointSnapshot, stage: StageContents, tensors: tuple[EncodedTensor, ...], path: Path,
    chunk_bytes: int, counter: _Counter,
) -> Generator[BuildProgress, None, FileRecord]:
    """Yield progress per tensor; return the written file's record (hashed while writing)."""
    entries = layout_tensors(t.planned() for t in tensors)
    handles: dict[str, BinaryIO] = {}
    try:
        with open(path, "wb") as out:
            writer = _HashingWriter(out)
            writer.write(encode_header(entries, weights_metadata(tensors)))
            for tensor in tensors:
                src = tensor.owned.source
                if src.shard not in handles:
                    handles[src.shard] = open(snapshot.checkpoint_dir / src.shard, "rb")
                write_tensor(handles[src.shard], tensor, writer.write, chunk_bytes)
                yield counter.advance(stage.stage.stage_index, tensor.nbytes())
        return FileRecord(path=path.name, size_bytes=writer.size_bytes, sha256=writer.digest.hexdigest())
    finally:
        for fh in handles.values():
            fh.close()


def _manifest(
    inspection: Inspection,
    plan: StagePlan,
    stage: StageContents,
    encoded: tuple[EncodedTensor, ...],
    tmp: Path,
    weights: FileRecord,
    boundary_dtypes: tuple[DType, DType],
    policy: str,
) -> StageManifest:
    snapshot, config = inspection.snapshot, inspection.config
    _place(inspection, CONFIG_FILE, tmp)
    config_record = FileRecord(CONFIG_FILE, (tmp / CONFIG_FILE).stat().st_size, sha256_file(tmp / CONFIG_FILE))
    if config_record.sha256 != snapshot.config_sha256:
        raise OutputDirError(f"{snapshot.checkpoint_dir / CONFIG_FILE} changed since inspection")
    records = [weights, config_record]
    if stage.owns_head:
        records.append(_tokenizer_copy(inspection, tmp))
    files = tuple(sorted(records, key=lambda r: r.path))
    entries = layout_tensors(t.planned() for t in encoded)
    tensors = tuple(
        ManifestTensor(e.name, e.dtype, e.shape, WEIGHTS_FILE, e.data_begin, e.data_end,
                       t.owned.source.name, t.owned.source.shard, t.record())
        for e, t in zip(entries, encoded, strict=True)
    )
    return StageManifest(
        schema=MANIFEST_SCHEMA,
        stage_index=stage.stage.stage_index,
        stage_count=stage.stage_count,
        layers=LayerSpan(stage.stage.layer_start, stage.stage.layer_end),
        owns_embeddings=stage.owns_embeddings,
        owns_head=stage.owns_head,
        tied_embeddings=config.tie_word_embeddings,
        tied_copies=stage.tied_copies,
        plan=PlanRef(plan.plan_id, plan.plan_hash),
        source=_lineage(snapshot),
        boundary_input=_boundary_input(config, stage, dtype_pb_name(boundary_dtypes[0])),
        boundary_output=_boundary_output(config, stage, dtype_pb_name(boundary_dtypes[1])),
        weights_policy=policy,
        weight_bytes=sum(t.nbytes() for t in encoded),
        files=files,
        tensors=tensors,
    )


def _place(inspection: Inspection, name: str, tmp: Path) -> None:
    """A byte copy of the checkpoint's file, or the derived bytes the inspection hashed."""
    derived = inspection.file_bytes(name)
    if derived is None:
        shutil.copyfile(inspection.snapshot.checkpoint_dir / name, tmp / name)
    else:
        (tmp / name).write_bytes(derived)


def _tokenizer_copy(inspection: Inspection, tmp: Path) -> FileRecord:
    """The final stage samples, and constrains samples to grammars, so it carries the tokenizer
    (the same bytes the lineage's tokenizer_sha256 names)."""
    snapshot = inspection.snapshot
    _place(inspection, TOKENIZER_FILE, tmp)
    record = FileRecord(TOKENIZER_FILE, (tmp / TOKENIZER_FILE).stat().st_size, sha256_file(tmp / TOKENIZER_FILE))
    if record.sha256 != snapshot.tokenizer_sha256:
        raise OutputDirError(f"{snapshot.checkpoint_dir / TOKENIZER_FILE} changed since inspection")
    return record


def _lineage(snapshot: CheckpointSnapshot) -> SourceLineage:
    return SourceLineage(
        snapshot_id=snapshot.snapshot_id,
        source=snapshot.source,
        revision=snapshot.revision,
        config_sha256=snapshot.config_sha256,
        tokenizer_sha256=snapshot.tokenizer_sha256,
        chat_template_sha256=snapshot.chat_template_sha256,
        weight_index_sha256=snapshot.weight_index_sha256,
        shards=snapshot.shards,
    )


def _boundary_input(config: DeepseekV2Config, stage: StageContents, dtype: str) -> BoundarySide:
    if stage.owns_embeddings:
        return BoundarySide("TENSOR_KIND_TOKEN_IDS", "ELEMENT_TYPE_INT32", 1)
    return BoundarySide("TENSOR_KIND_ACTIVATION", dtype, config.hidden_size)


def _boundary_output(config: DeepseekV2Config, stage: StageContents, dtype: str) -> BoundarySide:
    """The last stage's head produces float32 logits; sampling them is a runtime choice."""
    if stage.owns_head:
        return BoundarySide("TENSOR_KIND_LOGITS", "ELEMENT_TYPE_FP32", config.vocab_size)
    return BoundarySide("TENSOR_KIND_ACTIVATION", dtype, config.hidden_size)


def _commit(store: Path, tmp: Path, manifest: StageManifest, stage: StageContents) -> BuiltStage:
    """Name the directory by its manifest hash.

    An existing artifact of that hash that still verifies is kept (the new copy is identical);
    a damaged one is replaced.
    """
    (tmp / MANIFEST_FILE).write_bytes(encode_manifest(manifest))
    digest = manifest_hash(manifest)
    final = store / artifact_dir_name(digest)
    if final.exists() and _verifies(final, digest):
        shutil.rmtree(tmp)
    else:
        shutil.rmtree(final, ignore_errors=True)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; artifacts are read by other processes
        durable_rename(tmp, final)
    return BuiltStage(
        stage_index=stage.stage.stage_index,
        artifact_dir=final,
        manifest_hash=digest,
        layer_start=stage.stage.layer_start,
        layer_end=stage.stage.layer_end,
        weight_bytes=manifest.weight_bytes,
    )


def _verifies(artifact_dir: Path, digest: str) -> bool:
    try:
        verify_artifact(artifact_dir, expected_manifest_hash=digest)
    except ARTIFACT_ERRORS:
        return False
    return True


def stage_links(out_dir: Path) -> list[Path]:
    """The stage-<i> entries of a build directory, in stage order."""
    found = [p for p in out_dir.glob(f"{STAGE_LINK_PREFIX}*") if p.name[len(STAGE_LINK_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STAGE_LINK_PREFIX):]))


def _link_stages(out_dir: Path, built: list[BuiltStage]) -> None:
    """Point stage-<i> at each new artifact; drop links of stages this plan does not have."""
    wanted = {f"{STAGE_LINK_PREFIX}{s.stage_index}": s for s in built}
    for link in stage_links(out_dir):
        if link.name not in wanted:
            link.unlink()
    for name, stage in wanted.items():
        link = out_dir / name
        tmp_link = out_dir / f".{name}.tmp-{uuid.uuid4().hex}"
        os.symlink(Path(STORE_DIR) / stage.artifact_dir.name, tmp_link)
        os.replace(tmp_link, link)
    fsync_dir(out_dir)
