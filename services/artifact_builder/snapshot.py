"""Resolve a local Hugging Face checkpoint directory into an immutable, hashed snapshot.

Reads only safetensors headers (never tensor data) to learn every tensor's dtype, shape and
byte range, then checks them against the architecture the config implies. Structural damage
(missing files, a dangling index, a malformed header) raises; tensors that disagree with the
architecture are reported as problems, so a caller can show all of them at once.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from libs.artifacts.errors import SafetensorsHeaderError, SafetensorsTruncatedError
from libs.artifacts.manifest import FileRecord, canonical_hash
from libs.artifacts.safetensors_format import read_header
from libs.artifacts.verify import sha256_file
from libs.model.config import DeepseekV2Config, parse_config
from libs.model.errors import ConfigError
from libs.model.layout import EMBED, expected_tensors
from services.artifact_builder.errors import (
    CheckpointConfigError,
    CheckpointFileMissingError,
    CheckpointNotFoundError,
    IndexInvalidError,
    IndexMissingFileError,
    ShardInvalidError,
    ShardMissingError,
    TensorLayoutError,
)

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
GGUF_SUFFIX = ".gguf"
_SERIES = re.compile(r"^(?P<stem>.+)-(?P<num>\d+)-of-(?P<total>\d+)\.safetensors$")
_TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

MISSING, UNEXPECTED, WRONG_SHAPE, WRONG_DTYPE = "MISSING", "UNEXPECTED", "WRONG_SHAPE", "WRONG_DTYPE"


@dataclass(frozen=True)
class SourceTensor:
    """Where one checkpoint tensor lives: its shard and absolute byte range in that shard."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str
    offset: int
    nbytes: int
    # A tensor composed at build time from other stored tensors (a GGUF's split kv_b_proj).
    parts: tuple[SourceTensor, ...] = ()


@dataclass(frozen=True)
class TensorProblem:
    name: str
    problem: str  # MISSING, UNEXPECTED, WRONG_SHAPE or WRONG_DTYPE
    expected: str
    found: str


@dataclass(frozen=True)
class CheckpointSnapshot:
    """Content identity of a checkpoint; `snapshot_id` hashes content only, not paths."""

    snapshot_id: str
    checkpoint_dir: Path
    source: str
    revision: str
    config_sha256: str
    tokenizer_sha256: str
    chat_template_sha256: str
    weight_index_sha256: str  # "" for an unsharded checkpoint without an index
    shards: tuple[FileRecord, ...]
    num_layers: int
    tensor_count: int
    total_tensor_bytes: int
    tied_embeddings: bool
    weight_dtype: str


@dataclass(frozen=True)
class Inspection:
    snapshot: CheckpointSnapshot
    config: DeepseekV2Config
    tensors: tuple[SourceTensor, ...]
    problems: tuple[TensorProblem, ...]
    # (shard, size_bytes, mtime_ns) taken before hashing: a build refuses shards that changed.
    shard_stats: tuple[tuple[str, int, int], ...] = ()
    # Files derived from the source rather than copied from it (a GGUF's config and tokenizer):
    # name -> bytes, hashed into the snapshot like a checkpoint's own files.
    derived_files: tuple[tuple[str, bytes], ...] = ()
    # "safetensors" (a Hugging Face directory) or "gguf" (tensors keep their stored formats)
    source_format: str = "safetensors"

    def file_bytes(self, name: str) -> bytes | None:
        return dict(self.derived_files).get(name)

    @property
    def valid(self) -> bool:
        return not self.problems

    def by_name(self) -> dict[str, SourceTensor]:
        return {t.name: t for t in self.tensors}

    def require_valid(self) -> None:
        if self.problems:
            first = self.problems[0]
            raise TensorLayoutError(
                f"{len(self.problems)} tensor problems, first: {first.name} {first.problem} "
                f"(expected {first.expected or '-'}, found {first.found or '-'})",
                reason=f"CHECKPOINT_TENSOR_{first.problem}",
            )


def inspect_checkpoint(checkpoint_dir: str | Path, source: str = "", revision: str = "") -> Inspection:
    """A Hugging Face checkpoint directory, or a `.gguf` file (`gguf_snapshot`)."""
    root = Path(checkpoint_dir)
    if root.suffix == GGUF_SUFFIX and root.is_file():
        from services.artifact_builder.gguf_snapshot import inspect_gguf

        return inspect_gguf(root, source, revision)
    if not root.is_dir():
        raise CheckpointNotFoundError(f"{root} is not a directory", field="checkpoint_dir")
    raw_config = _read_json(root / CONFIG_FILE, CheckpointConfigError)
    try:
        config = parse_config(raw_config)
    except ConfigError as exc:
        raise CheckpointConfigError(f"{root / CONFIG_FILE}: {exc.message}") from exc
    weight_map, index_sha = _weight_map(root)
    shard_stats = shard_stat(root, sorted(set(weight_map.values())))
    tensors = _read_shards(root, weight_map)
    weight_dtype = _weight_dtype(raw_config, tensors)
    problems = check_tensors(config, weight_dtype, tensors)
    shards = tuple(
        FileRecord(path=s, size_bytes=(root / s).stat().st_size, sha256=sha256_file(root / s))
        for s in sorted(set(weight_map.values()))
    )
    config_sha, tokenizer_sha, template_sha = (
        sha256_file(root / CONFIG_FILE), _required_sha(root / TOKENIZER_FILE), _chat_template_sha(root))
    hashes = {
        "config": config_sha,
        "tokenizer": tokenizer_sha,
        "chat_template": template_sha,
        "weight_index": index_sha,
        "shards": [[s.path, s.sha256] for s in shards],
    }
    snapshot = CheckpointSnapshot(
        snapshot_id=canonical_hash(hashes),
        checkpoint_dir=root.resolve(),
        source=source,
        revision=revision,
        config_sha256=config_sha,
        tokenizer_sha256=tokenizer_sha,
        chat_template_sha256=template_sha,
        weight_index_sha256=index_sha,
        shards=shards,
        num_layers=config.num_hidden_layers,
        tensor_count=len(tensors),
        total_tensor_bytes=sum(t.nbytes for t in tensors),
        tied_embeddings=config.tie_word_embeddings,
        weight_dtype=weight_dtype,
    )
    return Inspection(snapshot=snapshot, config=config, tensors=tensors, problems=problems, shard_stats=shard_stats)


def shard_stat(root: Path, shards: list[str]) -> tuple[tuple[str, int, int], ...]:
    stats = ((name, (root / name).stat()) for name in shards)
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)


def check_tensors(
    config: DeepseekV2Config, weight_dtype: str, tensors: tuple[SourceTensor, ...], check_dtypes: bool = True
) -> tuple[TensorProblem, ...]:
    """Compare found tensors with the architecture: missing, unexpected, mis-shaped, mis-typed
    (a GGUF's tensors keep their own types, so `check_dtypes` is off for it)."""
    expected = expected_tensors(config, weight_dtype)
    found = {t.name: t for t in tensors}
    problems = [TensorProblem(n, MISSING, _spec(s.dtype, s.shape), "") for n, s in expected.items() if n not in found]
    problems += [
        TensorProblem(n, UNEXPECTED, "", _spec(t.dtype, t.shape)) for n, t in found.items() if n not in expected
    ]
    for name, spec in expected.items():
        tensor = found.get(name)
        if tensor is None:
            continue
        if tensor.shape != spec.shape:
            problems.append(
                TensorProblem(name, WRONG_SHAPE, _spec(spec.dtype, spec.shape), _spec(tensor.dtype, tensor.shape))
            )
        elif check_dtypes and tensor.dtype != spec.dtype:
            problems.append(TensorProblem(name, WRONG_DTYPE, spec.dtype, tensor.dtype))
    return tuple(problems)


def _spec(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}{list(shape)}"


def _read_json(path: Path, error: type) -> dict:
    if not path.is_file():
        raise error(f"{path} does not exist")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise error(f"{path} is not a JSON object")
    return document


def _required_sha(path: Path) -> str:
    if not path.is_file():
        raise CheckpointFileMissingError(f"{path} does not exist")
    return sha256_file(path)


def _chat_template_sha(root: Path) -> str:
    """sha256 of chat_template.jinja when present, else of the tokenizer_config template text.

    A list of named templates is hashed as its canonical JSON.
    """
    if (root / CHAT_TEMPLATE_FILE).is_file():
        return sha256_file(root / CHAT_TEMPLATE_FILE)
    tokenizer_config = _read_json(root / TOKENIZER_CONFIG_FILE, CheckpointFileMissingError)
    template = tokenizer_config.get("chat_template")
    if isinstance(template, str) and template:
        return hashlib.sha256(template.encode("utf-8")).hexdigest()
    if isinstance(template, list) and template:
        return canonical_hash(template).removeprefix("sha256:")
    raise CheckpointFileMissingError(f"{root}: no chat template in {TOKENIZER_CONFIG_FILE} or {CHAT_TEMPLATE_FILE}")


def _weight_map(root: Path) -> tuple[dict[str, str], str]:
    """Tensor name -> shard file name, plus the index sha256 ("" without an index)."""
    index_path = root / INDEX_FILE
    if not index_path.is_file():
        if not (root / SINGLE_WEIGHTS_FILE).is_file():
            raise CheckpointFileMissingError(f"{root} has neither {INDEX_FILE} nor {SINGLE_WEIGHTS_FILE}")
        header = _shard_header(root, SINGLE_WEIGHTS_FILE)
        return {t.name: SINGLE_WEIGHTS_FILE for t in header.tensors}, ""
    weight_map = _read_json(index_path, IndexInvalidError).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise IndexInvalidError(f"{index_path}: weight_map is not an object of file names")
    if any("/" in v or "\\" in v or v.startswith(".") for v in weight_map.values()):
        raise IndexInvalidError(f"{index_path}: weight_map names a file outside the checkpoint")
    _check_series(root, set(weight_map.values()))
    dangling = sorted({v for v in weight_map.values() if not (root / v).is_file()})
    if dangling:
        raise IndexMissingFileError(f"{index_path} points at missing files {dangling}")
    return dict(weight_map), sha256_file(index_path)


def _check_series(root: Path, referenced: set[str]) -> None:
    """A numbered shard series must be complete on disk, whether or not the index names it."""
    names = referenced | {p.name for p in root.glob("*.safetensors")}
    series = {(m["stem"], m["total"]) for m in map(_SERIES.match, names) if m}
    for stem, total in sorted(series):
        width = len(total)
        expected = {f"{stem}-{i:0{width}d}-of-{total}.safetensors" for i in range(1, int(total) + 1)}
        absent = sorted(n for n in expected if not (root / n).is_file())
        if absent:
            raise ShardMissingError(f"{root}: shard series {stem}-*-of-{total} lacks {absent}")


def _shard_header(root: Path, shard: str):
    try:
        return read_header(root / shard)
    except (SafetensorsHeaderError, SafetensorsTruncatedError) as exc:
        raise ShardInvalidError(f"{root / shard}: {exc.message}") from exc


def _read_shards(root: Path, weight_map: dict[str, str]) -> tuple[SourceTensor, ...]:
    tensors: dict[str, SourceTensor] = {}
    for shard in sorted(set(weight_map.values())):
        header = _shard_header(root, shard)
        for entry in header.tensors:
            if entry.name in tensors:
                raise ShardInvalidError(f"tensor {entry.name!r} appears in {tensors[entry.name].shard} and {shard}")
            if weight_map.get(entry.name) != shard:
                raise IndexInvalidError(
                    f"tensor {entry.name!r} is in {shard} but the index maps it to {weight_map.get(entry.name)!r}"
                )
            tensors[entry.name] = SourceTensor(
                entry.name, entry.dtype, entry.shape, shard, header.data_start + entry.data_begin, entry.nbytes
            )
    absent = sorted(set(weight_map) - set(tensors))
    if absent:
        raise IndexInvalidError(f"the index maps {len(absent)} tensors that no shard holds, e.g. {absent[:3]}")
    return tuple(tensors[n] for n in sorted(tensors))


def _weight_dtype(raw_config: dict, tensors: tuple[SourceTensor, ...]) -> str:
    """The stored weight dtype: from the config's dtype/torch_dtype, else the embeddings'."""
    declared = raw_config.get("dtype") or raw_config.get("torch_dtype")
    if declared is not None:
        if declared not in _TORCH_DTYPES:
            raise CheckpointConfigError(f"config dtype {declared!r} not in {sorted(_TORCH_DTYPES)}")
        return _TORCH_DTYPES[declared]
    embed = next((t for t in tensors if t.name == EMBED), None)
    if embed is None:
        raise CheckpointConfigError(f"config names no dtype and the checkpoint has no {EMBED}")
    return embed.dtype


# The small files other services need (text, config, weight index); never the weights.
MODEL_FILES = (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE, INDEX_FILE)


def model_files(checkpoint_dir: str | Path) -> list[tuple[str, bytes]]:
    root = Path(checkpoint_dir)
    if root.suffix == GGUF_SUFFIX and root.is_file():
        from services.artifact_builder.gguf_snapshot import gguf_model_files

        return gguf_model_files(root)
    return [(name, (root / name).read_bytes()) for name in MODEL_FILES if (root / name).is_file()]
