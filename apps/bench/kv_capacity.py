"""`fornax bench serve --kv-dtype fp32,bf16,fp8`: how many concurrent sequences one stage holds
at a fixed KV memory limit, per KV dtype, and its decode tokens/s with that KV.

For each dtype, one stage of every layer of the checkpoint (first and last) is built at
`kv_limit_bytes`:
- contract: the stage's own block accounting at that limit (`KvStore.pool.total_blocks`, from
  the block format's exact bytes) gives the sequences of `sequence_tokens` tokens it admits,
  blocks // blocks per sequence;
- physical check: that many sequences are then actually committed to the store (synthetic
  standard-normal KV rows, stored in the dtype), and one more is refused
  (`KvLimitExceededError`);
- physical: all but `decode_sequences` of them are released and those decode
  `decode_steps` tokens each through the stage's real kernels, attending over their
  `sequence_tokens`-token past (decode tokens/s, best of `repeats`).

The core (`capacity_for`) is pure; `measure` times and reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from libs.model.errors import KvLimitExceededError
from libs.model.kv_blocks import blocks_for, require_kv_backend
from libs.model.kv_store import KvLayout, KvStore, kv_slice

DEFAULT_KV_DTYPES = ("fp32", "bf16", "fp8")


@dataclass(frozen=True)
class KvCapacityOptions:
    checkpoint: str
    kv_dtypes: tuple[str, ...] = DEFAULT_KV_DTYPES
    backend: str = "numpy"
    kv_limit_bytes: int = 128 << 20
    sequence_tokens: int = 1024
    decode_sequences: int = 4
    decode_steps: int = 4
    repeats: int = 2
    verify: bool = True  # actually admit the computed sequences (and refuse one more)


@dataclass(frozen=True)
class Capacity:
    """Contract figures of one KV dtype at a limit, from the block format."""

    kv_dtype: str
    block_bytes: int
    blocks: int
    blocks_per_sequence: int
    sequences: int


def capacity_for(layout: KvLayout, kv_limit_bytes: int, sequence_tokens: int) -> Capacity:
    """The stage's own accounting: its pool at the limit, whole blocks per sequence."""
    store = KvStore(layout, kv_limit_bytes)
    per_sequence = blocks_for(sequence_tokens, store.block_tokens)
    return Capacity(layout.dtype, store.block_bytes, store.pool.total_blocks, per_sequence,
                    store.pool.total_blocks // per_sequence)


def check_options(options: KvCapacityOptions) -> None:
    """Before anything loads: known dtypes, each one its backend can hold (KV_DTYPE[_BACKEND])."""
    if not options.kv_dtypes:
        raise ValueError("KV_DTYPES_EMPTY: --kv-dtype needs at least one dtype")
    for dtype in options.kv_dtypes:
        require_kv_backend(dtype, options.backend, field="kv_dtype")
    for name in ("kv_limit_bytes", "sequence_tokens", "decode_sequences", "decode_steps", "repeats"):
        if getattr(options, name) < 1:
            raise ValueError(f"BAD_OPTION: {name} must be >= 1")


def admit(store: KvStore, count: int, sequence_tokens: int, seed: int = 0) -> int:
    """Commit `count` sequences of `sequence_tokens` synthetic rows; returns how many fit."""
    lay = store.layout
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((lay.layer_count, sequence_tokens, lay.kv_lora_rank), dtype=np.float32)
    k_rope = rng.standard_normal((lay.layer_count, sequence_tokens, lay.rope_dim), dtype=np.float32)
    for index in range(count):
        try:
            store.commit(kv_slice(f"seq-{index}", "bench", 0, 0, 0, sequence_tokens), latent, k_rope)
        except KvLimitExceededError:
            return index
    return count


def _decode_tokens_per_s(executor, live: list[str], options: KvCapacityOptions, vocab: int) -> float:
    from libs.model.executor import StageBatch

    rng = np.random.default_rng(1)
    best = 0.0
    position = options.sequence_tokens
    for _ in range(options.repeats):
        started = time.perf_counter()
        for _ in range(options.decode_steps):
            step = position - options.sequence_tokens + 1
            slices = tuple(kv_slice(name, "bench", step, position, step, 1) for name in live)
            tokens = rng.integers(3, vocab, size=len(live)).astype(np.int32)
            executor.execute(StageBatch(slices, tokens))
            position += 1
        best = max(best, len(live) * options.decode_steps / (time.perf_counter() - started))
    return best


def _layout(options: KvCapacityOptions, kv_dtype: str) -> KvLayout:
    from libs.model.config import load_config

    cfg = load_config(options.checkpoint)
    return KvLayout(cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim, kv_dtype)


def measure_dtype(options: KvCapacityOptions, kv_dtype: str) -> dict[str, object]:
    from libs.model.config import load_config
    from libs.model.executor import StageExecutor, StageSpec
    from libs.model.kernels import make_kernels
    from libs.model.weights import load_stage_weights

    cfg = load_config(options.checkpoint)
    n = cfg.num_hidden_layers
    layout = KvLayout(n, cfg.kv_lora_rank, cfg.qk_rope_head_dim, kv_dtype)
    contract = capacity_for(layout, options.kv_limit_bytes, options.sequence_tokens)
    row: dict[str, object] = {
        "block_bytes": contract.block_bytes, "blocks_at_limit": contract.blocks,
        "blocks_per_sequence": contract.blocks_per_sequence, "sequences": contract.sequences,
        "bytes_per_token": str(layout.bytes_per_token_exact),
    }
    if not options.verify:
        return row
    weights = load_stage_weights(options.checkpoint, cfg, 0, n, True, True)
    kernels = make_kernels(options.backend, cfg, weights)
    executor = StageExecutor(cfg, StageSpec(0, n, True, True, options.kv_limit_bytes, kv_dtype), kernels)
    admitted = admit(executor.kv, contract.sequences, options.sequence_tokens)
    refused_next = admit_one_more(executor.kv, contract.sequences, options.sequence_tokens)
    row.update(sequences_admitted=admitted, next_sequence_refused=refused_next,
               kv_bytes_used=executor.kv.bytes_used())
    live = [f"seq-{i}" for i in range(min(options.decode_sequences, admitted))]
    for index in range(len(live), admitted):
        executor.release(f"seq-{index}", "bench")
    if live:
        row["decode_sequences"] = len(live)
        row["decode_tokens_per_s"] = _decode_tokens_per_s(executor, live, options, cfg.vocab_size)
    return row


def admit_one_more(store: KvStore, index: int, sequence_tokens: int) -> bool:
    """Whether one more sequence is refused (the store's limit is what the contract says)."""
    lay = store.layout
    rows = (np.zeros((lay.layer_count, sequence_tokens, lay.kv_lora_rank), np.float32),
            np.zeros((lay.layer_count, sequence_tokens, lay.rope_dim), np.float32))
    try:
        store.commit(kv_slice(f"seq-{index}", "bench", 0, 0, 0, sequence_tokens), *rows)
    except KvLimitExceededError:
        return True
    store.release(f"seq-{index}", "bench")
    return False


def ratios(capacities: dict[str, Capacity]) -> dict[str, float]:
    """`sequences_vs_fp32_<dtype>` for every dtype beside fp32 (contract figures)."""
    base = capacities.get("fp32")
    if base is None or not base.sequences:
        return {}
    return {f"sequences_vs_fp32_{name}": c.sequences / base.sequences
            for name, c in capacities.items() if name != "fp32"}


def run(options: KvCapacityOptions, command: str) -> dict[str, Any]:
    import platform
    from importlib import metadata

    from libs.service.affinity import usable_cpus
    from libs.service.host import cpu_name

    check_options(options)
    capacities = {d: capacity_for(_layout(options, d), options.kv_limit_bytes, options.sequence_tokens)
                  for d in options.kv_dtypes}
    per_dtype = {dtype: measure_dtype(options, dtype) for dtype in options.kv_dtypes}
    hardware = f"{cpu_name() or platform.machine()}, {len(usable_cpus())} usable CPUs"
    report: dict[str, Any] = {**ratios(capacities), "kv_dtypes": per_dtype}
    report["setup"] = {"kv_limit_bytes": options.kv_limit_bytes, "sequence_tokens": options.sequence_tokens,
                       "decode_sequences": options.decode_sequences, "decode_steps": options.decode_steps,
                       "repeats": options.repeats, "backend": options.backend, "checkpoint": options.checkpoint,
                       "stage": "one stage holding every layer"}
    report["figures"] = {
        "sequences_vs_fp32_*, sequences, blocks_at_limit, block_bytes, bytes_per_token":
            "contract: computed from the KV block format by the stage's own block accounting at kv_limit_bytes",
        "sequences_admitted, next_sequence_refused, kv_bytes_used":
            f"physical: the contract's sequences committed to the stage's KV store (synthetic rows), "
            f"{hardware}, command: {command}",
        "decode_tokens_per_s":
            f"physical: best of {options.repeats} runs of {options.decode_steps} decode steps over a "
            f"{options.sequence_tokens}-token past, {hardware}, {options.backend} "
            f"{metadata.version('numpy') if options.backend == 'numpy' else ''}".rstrip()
            + f", command: {command}",
    }
    return report
