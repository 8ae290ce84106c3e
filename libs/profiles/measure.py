"""Measure one stage's layer kinds on the kernels it really runs: the core of a stage profile.

Each layer kind is timed alone, on the inputs the stage executor would give it:
- prefill: one sequence of S new tokens with no past, cost per token = time / S;
- decode: `batch` sequences of one new token each, every one with `context` tokens of past,
  cost per microbatch = time of the call, at every batch of the grid and every past of its
  context grid (attention reads rows x past, so the cost moves with both);
- embed and head likewise (the head, as the executor runs it, computes one row per sequence).

A run is the mean over enough calls to last `min_run_s` (at least one); `runs` runs make one
`Figure` (median, spread). Every shape is called once untimed first, so a backend that compiles
per shape is timed warm. Pure apart from the kernels and the clock, both passed in.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.kernels import MASK_NEG, LayerInputs, StageKernels
from libs.model.rope import rope_tables
from libs.model.weights import LayerWeights, StageWeights
from libs.profiles.schema import DECODE_BATCHES, DECODE_CONTEXTS, PREFILL_LENGTHS, Figure, LayerKindProfile
from libs.weights.tensor import PackedWeight

Clock = Callable[[], float]
KV_BYTES_PER_ELEMENT = 4  # the KV store holds float32 latents and rope keys


@dataclass(frozen=True)
class Grid:
    """What one stage profile measures; the defaults are the profile's published grid."""

    prefill_lengths: tuple[int, ...] = PREFILL_LENGTHS
    decode_batches: tuple[int, ...] = DECODE_BATCHES
    decode_contexts: tuple[int, ...] = DECODE_CONTEXTS  # past tokens of every decode row, per figure
    runs: int = 3
    # A run spans several CFS periods (100 ms), so a host's CPU quota shows in its figures.
    min_run_s: float = 0.3

    def check(self) -> None:
        if self.runs < 1:
            raise ValueError(f"runs must be at least 1, got {self.runs}")
        if not self.prefill_lengths or min(self.prefill_lengths) < 1:
            raise ValueError(f"prefill lengths must be positive, got {self.prefill_lengths}")
        if not self.decode_batches or min(self.decode_batches) < 1:
            raise ValueError(f"decode batches must be positive, got {self.decode_batches}")
        if not self.decode_contexts or min(self.decode_contexts) < 0:
            raise ValueError(f"decode contexts must not be negative, got {self.decode_contexts}")

    @property
    def context_tokens(self) -> int:
        """The largest past measured: the context the profile states, and the one its plain
        `decode_s_per_microbatch` figures stand at."""
        return max(self.decode_contexts)


def timed_runs(call: Callable[[], object], runs: int, min_run_s: float,
               clock: Clock = time.perf_counter) -> list[float]:
    """Seconds per call, one sample per run. The first (warm-up) call also sizes the runs."""
    start = clock()
    call()
    first = max(clock() - start, 1e-9)
    calls = max(1, min(1000, int(min_run_s / first)))
    samples = []
    for _ in range(runs):
        start = clock()
        for _ in range(calls):
            call()
        samples.append((clock() - start) / calls)
    return samples


def per_unit(samples: Sequence[float], units: int, unit: str) -> Figure:
    return Figure.of([s / units for s in samples], unit)


def _weight_arrays(weights: object) -> Iterator[np.ndarray]:
    """Every stored array of a weight record (each once), through nested records, packed weights,
    per-expert sequences and a stage's table of layers."""
    seen: set[int] = set()
    stack: list[object] = [weights]
    while stack:
        item = stack.pop()
        if isinstance(item, PackedWeight):
            item = item.data
        if isinstance(item, np.ndarray):
            if id(item) not in seen:
                seen.add(id(item))
                yield item
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif item is not None and hasattr(item, "__dataclass_fields__"):
            stack.extend(getattr(item, name) for name in item.__dataclass_fields__)


def layer_resident_bytes(layer: LayerWeights) -> int:
    """Bytes of one layer's weights as the stage holds them: every array and packed weight,
    through nested weight records and per-expert sequences."""
    return sum(int(a.nbytes) for a in _weight_arrays(layer))


def _file_mapped(array: np.ndarray) -> bool:
    """Whether the array's memory is a map of a file. An array computed from a map keeps the
    `np.memmap` class without any map behind it, so only an `mmap.mmap` at the root counts."""
    base: object = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def weight_copy_bytes(weights: object) -> int:
    """Bytes of the weights held as copies in the process's own memory (converted or decoded
    arrays), not as maps of the weight files: anonymous memory the plan counts as weights."""
    return sum(int(a.nbytes) for a in _weight_arrays(weights) if not _file_mapped(a))


def kv_bytes_per_token(cfg: DeepseekV2Config) -> int:
    """KV one layer keeps per token: the compressed latent and the rope key."""
    return KV_BYTES_PER_ELEMENT * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)


def layer_kind(cfg: DeepseekV2Config, layer_index: int) -> str:
    return "moe" if cfg.is_moe_layer(layer_index) else "dense"


class InputMaker:
    """Deterministic inputs shaped as the stage executor builds them."""

    def __init__(self, cfg: DeepseekV2Config, seed: int = 0):
        self.cfg = cfg
        self.rope = rope_tables(cfg)
        self.rng = np.random.default_rng(seed)

    def hidden(self, rows: int) -> np.ndarray:
        return (self.rng.standard_normal((rows, self.cfg.hidden_size)) * 0.5).astype(np.float32)

    def prefill(self, length: int) -> LayerInputs:
        positions = np.arange(length, dtype=np.int64)
        cos, sin = self.rope.cos_sin(positions)
        mask = np.where(positions[None, :] <= positions[:, None], np.float32(0), MASK_NEG).astype(np.float32)
        return LayerInputs(self.hidden(length), cos, sin, self._latent(0), self._rope_keys(0), mask)

    def decode(self, batch: int, context: int) -> LayerInputs:
        positions = np.full(batch, context, dtype=np.int64)
        cos, sin = self.rope.cos_sin(positions)
        past_owner = np.repeat(np.arange(batch), context)
        keys_owner = np.concatenate([past_owner, np.arange(batch)])
        mask = np.where(keys_owner[None, :] == np.arange(batch)[:, None], np.float32(0), MASK_NEG)
        return LayerInputs(self.hidden(batch), cos, sin, self._latent(batch * context),
                           self._rope_keys(batch * context), np.ascontiguousarray(mask, dtype=np.float32))

    def _latent(self, rows: int) -> np.ndarray:
        return (self.rng.standard_normal((rows, self.cfg.kv_lora_rank)) * 0.5).astype(np.float32)

    def _rope_keys(self, rows: int) -> np.ndarray:
        return (self.rng.standard_normal((rows, self.cfg.qk_rope_head_dim)) * 0.5).astype(np.float32)

    def token_ids(self, rows: int) -> np.ndarray:
        return self.rng.integers(0, self.cfg.vocab_size, rows, dtype=np.int32)


def _figures(grid: Grid, clock: Clock, sizes: tuple[int, ...], call: Callable[[np.ndarray], object],
             make_input: Callable[[int], np.ndarray], per: Callable[[int], int], unit: str) -> dict[int, Figure]:
    """One figure per size: `call(make_input(size))` timed, divided by `per(size)`."""
    figures = {}
    for size in sizes:
        value = make_input(size)
        figures[size] = per_unit(timed_runs(partial(call, value), grid.runs, grid.min_run_s, clock), per(size), unit)
    return figures


def measure_layer(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, layer_index: int,
                  grid: Grid, clock: Clock = time.perf_counter) -> LayerKindProfile:
    """One decoder layer, timed alone through the stage's kernels."""
    make = InputMaker(cfg, seed=layer_index)
    prefill: dict[int, Figure] = {}
    by_context: dict[int, dict[int, Figure]] = {}
    for length in grid.prefill_lengths:
        inputs = make.prefill(length)
        samples = timed_runs(partial(kernels.decoder_layer, layer_index, inputs), grid.runs, grid.min_run_s, clock)
        prefill[length] = per_unit(samples, length, "s/token")
    for context in sorted(set(grid.decode_contexts)):
        decode: dict[int, Figure] = {}
        for batch in grid.decode_batches:
            inputs = make.decode(batch, context)
            samples = timed_runs(partial(kernels.decoder_layer, layer_index, inputs), grid.runs, grid.min_run_s,
                                 clock)
            decode[batch] = per_unit(samples, 1, "s/microbatch")
        by_context[context] = decode
    return LayerKindProfile(layer_kind(cfg, layer_index), prefill, by_context[grid.context_tokens],
                            layer_resident_bytes(weights.layer(layer_index)), kv_bytes_per_token(cfg), by_context)


def measure_embed(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, grid: Grid,
                  clock: Clock = time.perf_counter) -> LayerKindProfile:
    if weights.embed is None:
        raise ValueError("this stage holds no embeddings")
    make = InputMaker(cfg, seed=1000)
    prefill = _figures(grid, clock, grid.prefill_lengths, kernels.embed, make.token_ids, lambda n: n, "s/token")
    decode = _figures(grid, clock, grid.decode_batches, kernels.embed, make.token_ids, lambda _: 1, "s/microbatch")
    return LayerKindProfile("embed", prefill, decode, int(weights.embed.nbytes), 0)


def measure_head(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, grid: Grid,
                 clock: Clock = time.perf_counter) -> LayerKindProfile:
    """Final norm and lm_head. A prefill computes logits for its last row only (as the executor
    does), so its cost per token is one row's cost over S."""
    if weights.lm_head is None or weights.final_norm is None:
        raise ValueError("this stage holds no head")
    make = InputMaker(cfg, seed=2000)
    row = make.hidden(1)
    one_row = timed_runs(lambda: kernels.final(row), grid.runs, grid.min_run_s, clock)
    prefill = {n: per_unit(one_row, n, "s/token") for n in grid.prefill_lengths}
    decode = _figures(grid, clock, grid.decode_batches, kernels.final, make.hidden, lambda _: 1, "s/microbatch")
    return LayerKindProfile("head", prefill, decode, int(weights.lm_head.nbytes + weights.final_norm.nbytes), 0)


def kinds_to_measure(cfg: DeepseekV2Config, layer_start: int, layer_end: int,
                     already: frozenset[str] = frozenset()) -> dict[str, int]:
    """The first layer of each kind in [layer_start, layer_end) not yet measured: kind -> layer."""
    found: dict[str, int] = {}
    for layer in range(layer_start, layer_end):
        kind = layer_kind(cfg, layer)
        if kind not in already and kind not in found:
            found[kind] = layer
    return found


def profiling_ranges(cfg: DeepseekV2Config) -> tuple[tuple[int, int], ...]:
    """Contiguous ranges covering the model, cut so that the first range holds the embeddings, the
    first dense and the first MoE layer, and the last range only the final layer and the head.
    A profile then needs the first and last range only, however large the model."""
    layers = cfg.num_hidden_layers
    dense = next((i for i in range(layers) if not cfg.is_moe_layer(i)), None)
    moe = next((i for i in range(layers) if cfg.is_moe_layer(i)), None)
    head_end = max(i for i in (dense, moe) if i is not None) + 1
    cuts = [0, head_end]
    if head_end < layers - 1:
        cuts.append(layers - 1)
    if cuts[-1] != layers:
        cuts.append(layers)
    return tuple((a, b) for a, b in zip(cuts, cuts[1:], strict=False))
