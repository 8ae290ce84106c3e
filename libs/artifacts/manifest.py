"""The stage manifest: what one stage artifact holds, where it came from, and its canonical hash.

The manifest hash is "sha256:<hex>" of the canonical JSON of the manifest (sorted keys, compact
separators, ASCII only). The manifest never contains its own hash; the artifact directory is
named by it instead (see `artifact_dir_name`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from libs.artifacts.errors import ManifestInvalidError

MANIFEST_SCHEMA = "fornax.stage_manifest.v2"
MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
LAYER_RANGE_CONVENTION = (
    "half-open [layer_start, layer_end_exclusive) over zero-based decoder layer indices"
)
HASH_PREFIX = "sha256:"
ARTIFACT_DIR_PREFIX = "sha256-"


@dataclass(frozen=True)
class FileRecord:
    """A file by its path (relative to its directory), size and bare-hex sha256."""

    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class SourceLineage:
    """The immutable checkpoint snapshot a stage was cut from."""

    snapshot_id: str
    source: str
    revision: str
    config_sha256: str
    tokenizer_sha256: str
    chat_template_sha256: str
    weight_index_sha256: str
    shards: tuple[FileRecord, ...]


@dataclass(frozen=True)
class LayerSpan:
    layer_start: int
    layer_end: int
    convention: str = LAYER_RANGE_CONVENTION


@dataclass(frozen=True)
class PlanRef:
    plan_id: str
    plan_hash: str


@dataclass(frozen=True)
class BoundarySide:
    """One side of the stage boundary: kind and dtype use the fornax.common.v1 enum names."""

    kind: str
    dtype: str
    width: int


@dataclass(frozen=True)
class TensorFormat:
    """How a tensor is stored: its weight format (`libs.weights.formats`), logical shape, block,
    scale dtype, the source dtype it was made from and who wrote the bytes. `wanted` is the
    policy's choice; `fallback` says why a row's length moved it to another format, and
    `conversion` why the stage's backend holds another format than the policy's ("" when not)."""

    format: str
    logical_shape: tuple[int, ...]
    block_size: int
    scale_dtype: str
    source_dtype: str
    quantizer: str
    wanted: str
    fallback: str
    conversion: str


@dataclass(frozen=True)
class ManifestTensor:
    """A tensor of the artifact; offsets are relative to the safetensors data section.

    `dtype` and `shape` are the stored safetensors entry's (U8 [rows, row bytes] for a block
    format); `weight_format` gives the logical tensor. `source_name` differs from `name` only
    for a declared tied copy.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    data_begin: int
    data_end: int
    source_name: str
    source_file: str
    weight_format: TensorFormat


@dataclass(frozen=True)
class StageManifest:
    schema: str
    stage_index: int
    stage_count: int
    layers: LayerSpan
    owns_embeddings: bool
    owns_head: bool
    tied_embeddings: bool
    tied_copies: tuple[str, ...]
    plan: PlanRef
    source: SourceLineage
    boundary_input: BoundarySide
    boundary_output: BoundarySide
    weights_policy: str
    weight_bytes: int
    files: tuple[FileRecord, ...]
    tensors: tuple[ManifestTensor, ...]


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def canonical_hash(value: Any) -> str:
    return HASH_PREFIX + hashlib.sha256(canonical_json(value)).hexdigest()


# The stored manifest (and so its hash) names the end of its layer range
# `layer_end_exclusive`; in Python it is `LayerSpan.layer_end`. These two functions are the
# only places the names meet.
STORED_LAYER_END = "layer_end_exclusive"


def manifest_to_dict(manifest: StageManifest) -> dict[str, Any]:
    document = dataclasses.asdict(manifest)
    layers = document["layers"]
    layers[STORED_LAYER_END] = layers.pop("layer_end")
    return document


def _from_stored_names(document: Any) -> Any:
    """The stored document with the Python field names, for `_decode`; a document that uses
    the Python name `layer_end` itself is not a stored manifest."""
    layers = document.get("layers") if isinstance(document, dict) else None
    if not isinstance(layers, dict):
        return document  # _decode says what is wrong with it
    if "layer_end" in layers:
        raise ManifestInvalidError("manifest.layers: unknown fields ['layer_end']")
    if STORED_LAYER_END not in layers:
        raise ManifestInvalidError(f"manifest.layers: missing fields [{STORED_LAYER_END!r}]")
    renamed = {("layer_end" if k == STORED_LAYER_END else k): v for k, v in layers.items()}
    return {**document, "layers": renamed}


def manifest_hash(manifest: StageManifest) -> str:
    return canonical_hash(manifest_to_dict(manifest))


def encode_manifest(manifest: StageManifest) -> bytes:
    """The on-disk form: sorted keys, indented for people; the hash ignores the whitespace."""
    text = json.dumps(manifest_to_dict(manifest), sort_keys=True, indent=2, ensure_ascii=True)
    return (text + "\n").encode("ascii")


def decode_manifest(raw: bytes) -> StageManifest:
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestInvalidError(f"manifest is not JSON: {exc}") from exc
    manifest = _decode(StageManifest, _from_stored_names(document), "manifest")
    if manifest.schema != MANIFEST_SCHEMA:
        raise ManifestInvalidError(f"manifest schema {manifest.schema!r}, expected {MANIFEST_SCHEMA!r}")
    return manifest


def artifact_dir_name(hash_value: str) -> str:
    """Directory name of a content-addressed artifact: "sha256-<hex>"."""
    if not hash_value.startswith(HASH_PREFIX):
        raise ValueError(f"not a sha256 hash: {hash_value!r}")
    return ARTIFACT_DIR_PREFIX + hash_value[len(HASH_PREFIX):]


def hash_from_dir_name(name: str) -> str | None:
    if not name.startswith(ARTIFACT_DIR_PREFIX):
        return None
    return HASH_PREFIX + name[len(ARTIFACT_DIR_PREFIX):]


def _decode(kind: Any, value: Any, where: str) -> Any:
    """Strict decoding into frozen dataclasses: closed field sets, exact scalar types."""
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ManifestInvalidError(f"{where}: expected an object")
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind)}
        if set(value) != names:
            missing, extra = sorted(names - set(value)), sorted(set(value) - names)
            raise ManifestInvalidError(f"{where}: missing fields {missing}, unknown fields {extra}")
        return typing.cast(Any, kind)(**{n: _decode(hints[n], value[n], f"{where}.{n}") for n in names})
    origin = typing.get_origin(kind)
    if origin is tuple:
        if not isinstance(value, list):
            raise ManifestInvalidError(f"{where}: expected a list")
        (item,) = [a for a in typing.get_args(kind) if a is not Ellipsis]
        return tuple(_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is types.UnionType:
        raise ManifestInvalidError(f"{where}: unsupported union field")
    # bool is an int subclass in Python; keep them apart.
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ManifestInvalidError(f"{where}: expected an integer")
    if kind is not int and not isinstance(value, kind):
        raise ManifestInvalidError(f"{where}: expected {kind.__name__}")
    return value
