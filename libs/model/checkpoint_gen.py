"""Deterministic random-weight checkpoints in the Hugging Face DeepseekV2ForCausalLM layout.

Every tensor is drawn from its own random stream, seeded by (seed, tensor name), so the
bytes do not depend on sharding or generation order, and the model is written tensor by
tensor: the largest preset is never held in memory whole.

Scales keep activations well conditioned: projections use std 1/sqrt(fan_in) (halved on the
residual-writing projections), norm weights are uniform in [0.8, 1.2], and router logits
have unit spread so that expert choice is decisive but not degenerate.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libs.model.config import DeepseekV2Config, parse_config
from libs.model.errors import CheckpointError
from libs.model.layout import EMBED, TensorSpec, expected_tensors
from libs.model.presets import preset_config
from libs.model.safetensors_io import SafetensorsWriter
from libs.model.tokenizer_build import (
    ASSETS,
    BOS_TOKEN,
    EOS_TOKEN,
    TOKENIZER_CONFIG_JSON,
    TOKENIZER_JSON,
    checkpoint_tokenizer_json,
    special_token_id,
    tokenizer_vocab_size,
)
from libs.model.weights import INDEX_NAME, SINGLE_NAME

DEFAULT_MAX_SHARD_BYTES = 1024 * 1024 * 1024
_RESIDUAL_WRITERS = ("o_proj.weight", "down_proj.weight")


@dataclass(frozen=True)
class CheckpointRequest:
    preset: str
    out_dir: Path
    seed: int = 0
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES


@dataclass(frozen=True)
class CheckpointSummary:
    out_dir: Path
    parameter_count: int
    total_bytes: int
    shard_files: tuple[str, ...]


def tensor_values(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of one tensor; a pure function of (seed, name, shape)."""
    digest = hashlib.sha256(name.encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    rng = np.random.default_rng(np.random.SeedSequence([seed, *words]))
    if len(shape) == 1:  # every 1-D tensor of this architecture is an RMSNorm weight
        return rng.uniform(0.8, 1.2, size=shape).astype(np.float32)
    if name == EMBED:
        return rng.standard_normal(size=shape, dtype=np.float32)
    std = 1.0 / np.sqrt(shape[-1])
    if name.endswith(_RESIDUAL_WRITERS):
        std *= 0.5
    return rng.standard_normal(size=shape, dtype=np.float32) * np.float32(std)


def plan_shards(specs: dict[str, TensorSpec], max_shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for name, spec in specs.items():
        size = 2 * int(np.prod(spec.shape, dtype=np.int64))
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def shard_file_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_NAME]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_checkpoint(
    request: CheckpointRequest, progress: Callable[[str], None] | None = None
) -> CheckpointSummary:
    bos, eos = special_token_id(BOS_TOKEN), special_token_id(EOS_TOKEN)
    raw = preset_config(request.preset, bos, eos)
    if raw["vocab_size"] < tokenizer_vocab_size():
        raise ValueError(f"preset vocab {raw['vocab_size']} < tokenizer vocab {tokenizer_vocab_size()}")
    cfg = parse_config(raw)
    out = request.out_dir
    out.mkdir(parents=True, exist_ok=True)
    specs = expected_tensors(cfg)
    total_bytes = sum(2 * int(np.prod(s.shape, dtype=np.int64)) for s in specs.values())
    require_disk(out, total_bytes)
    if progress:
        progress(f"writing {total_bytes / 2**30:.2f} GiB of bf16 weights to {out} "
                 f"({shutil.disk_usage(out).free / 2**30:.1f} GiB free)")
    shards = plan_shards(specs, request.max_shard_bytes)
    files = shard_file_names(len(shards))
    for file_name, names in zip(files, shards, strict=True):
        _write_shard(out / file_name, names, specs, request.seed)
        if progress:
            progress(f"wrote {file_name} ({len(names)} tensors)")
    if len(files) > 1:
        weight_map = {name: f for f, names in zip(files, shards, strict=True) for name in names}
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (out / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    _write_side_files(out, raw, cfg)
    params = sum(int(np.prod(s.shape, dtype=np.int64)) for s in specs.values())
    return CheckpointSummary(out, params, total_bytes, tuple(files))


class InsufficientDiskError(CheckpointError):
    default_reason = "INSUFFICIENT_DISK"


def require_disk(out: Path, needed_bytes: int, headroom_bytes: int = 64 * 2**20) -> None:
    """Refuse before writing anything when the checkpoint (plus headroom) cannot fit."""
    free = shutil.disk_usage(out).free
    if free < needed_bytes + headroom_bytes:
        raise InsufficientDiskError(
            f"{out} has {free:,} bytes free; the checkpoint needs {needed_bytes:,} (+{headroom_bytes:,} headroom)")


def _write_shard(path: Path, names: list[str], specs: dict[str, TensorSpec], seed: int) -> None:
    writer = SafetensorsWriter(path, [(n, "BF16", specs[n].shape) for n in names], {"format": "pt"})
    for name in names:
        writer.write(name, tensor_values(seed, name, specs[name].shape))
    writer.close()


def _write_side_files(out: Path, raw: dict, cfg: DeepseekV2Config) -> None:
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    (out / TOKENIZER_JSON).write_text(checkpoint_tokenizer_json(cfg.vocab_size))
    shutil.copyfile(ASSETS / TOKENIZER_CONFIG_JSON, out / TOKENIZER_CONFIG_JSON)
