"""A `deepseek2` GGUF file as a checkpoint snapshot the artifact builder builds from.

The tensors are byte ranges of the file under their Hugging Face names (`libs.model.gguf_source`);
config.json, tokenizer.json and tokenizer_config.json are derived from the metadata
(deterministically, so the same file always gives the same bytes) and travel as the inspection's
derived files. The snapshot hashes them like a checkpoint's own files, and the file itself as its
one shard, so lineage covers the stored tensor bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from libs.artifacts.manifest import FileRecord, canonical_hash
from libs.artifacts.verify import sha256_file
from libs.model.config import parse_config
from libs.model.errors import ConfigError
from libs.model.gguf_source import MappedTensor, config_from_metadata, config_json_bytes, map_tensors, read_gguf
from libs.model.gguf_tokenizer import tokenizer_config_json, tokenizer_json
from services.artifact_builder.errors import CheckpointConfigError, CheckpointNotFoundError
from services.artifact_builder.snapshot import (
    CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    CheckpointSnapshot,
    Inspection,
    SourceTensor,
    check_tensors,
    shard_stat,
)

SOURCE_FORMAT = "gguf"


def gguf_model_files(path: Path) -> list[tuple[str, bytes]]:
    """The derived config and tokenizer files (what `model_files` gives for a directory)."""
    metadata, tensors = read_gguf(str(path))
    return list(_derived(metadata, config_from_metadata(metadata, {t.name for t in tensors})))


def _derived(metadata: dict, cfg_raw: dict) -> tuple[tuple[str, bytes], ...]:
    return (
        (CONFIG_FILE, config_json_bytes(cfg_raw)),
        (TOKENIZER_FILE, tokenizer_json(metadata).encode()),
        (TOKENIZER_CONFIG_FILE, tokenizer_config_json(metadata).encode()),
    )


def _source(t: MappedTensor, shard: str) -> SourceTensor:
    parts = tuple(SourceTensor(p.name, p.gguf_type, p.shape, shard, p.offset, p.nbytes) for p in t.parts)
    return SourceTensor(t.name, t.gguf_type, t.shape, shard, t.offset, t.nbytes, parts)


def inspect_gguf(path: Path, source: str = "", revision: str = "") -> Inspection:
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path} is not a file", field="checkpoint_dir")
    metadata, found = read_gguf(str(path))
    cfg_raw = config_from_metadata(metadata, {t.name for t in found})
    try:
        config = parse_config(cfg_raw)
    except ConfigError as exc:
        raise CheckpointConfigError(f"{path}: the GGUF metadata describes no supported model: {exc.message}") from exc
    shard = path.name
    tensors = tuple(sorted((_source(t, shard) for t in map_tensors(found, cfg_raw)), key=lambda t: t.name))
    derived = _derived(metadata, cfg_raw)
    files = dict(derived)
    stats = shard_stat(path.parent, [shard])
    shard_record = FileRecord(path=shard, size_bytes=path.stat().st_size, sha256=sha256_file(path))
    config_sha, tokenizer_sha = (hashlib.sha256(files[n]).hexdigest() for n in (CONFIG_FILE, TOKENIZER_FILE))
    template_sha = hashlib.sha256(json.loads(files[TOKENIZER_CONFIG_FILE])["chat_template"].encode()).hexdigest()
    hashes = {"config": config_sha, "tokenizer": tokenizer_sha, "chat_template": template_sha,
              "weight_index": "", "shards": [[shard_record.path, shard_record.sha256]]}
    snapshot = CheckpointSnapshot(
        snapshot_id=canonical_hash(hashes),
        checkpoint_dir=path.parent.resolve(),
        source=source,
        revision=revision,
        config_sha256=config_sha,
        tokenizer_sha256=tokenizer_sha,
        chat_template_sha256=template_sha,
        weight_index_sha256="",
        shards=(shard_record,),
        num_layers=config.num_hidden_layers,
        tensor_count=len(tensors),
        total_tensor_bytes=sum(t.nbytes for t in found),
        tied_embeddings=config.tie_word_embeddings,
        weight_dtype=SOURCE_FORMAT,
    )
    problems = check_tensors(config, "", tensors, check_dtypes=False)
    return Inspection(snapshot=snapshot, config=config, tensors=tensors, problems=problems, shard_stats=stats,
                      derived_files=derived, source_format=SOURCE_FORMAT)
