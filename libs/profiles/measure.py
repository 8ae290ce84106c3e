"""Measure one stage's layer kinds on the kernels it really runs: the core of a stage profile.

Each layer kind is timed alone, on the inputs the stage executor would give it:
- prefill: one sequence of S new tokens with no past, cost per token = time / S;
- decode: `batch` sequences of one new token each, every one with `context` tokens of past,
  cost per microbatch = time of the call, at every batch of the grid and every past of its
  context grid (attention reads rows x past, so the cost moves with both);
- embed and head likewise (the head, as the executor runs it, computes one row per sequence).

A run is the mean over enough calls to last `min_run_s` (at least one); `runs` runs make one
`Figure` (median, spread). Every shape is called once untimed first, so a backend that compiles
per shape is timed warm. The runs of every figure of a profiled range (each layer kind, the
embeddings, the head) are taken round-robin (`interleaved_runs`). Pure apart from the kernels
and the clock, both passed in.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.kernels import MASK_NEG, LayerInputs, StageKernels
from libs.model.rope import rope_tables
from libs.model.weights import LayerWeights, StageWeights
from libs.profiles.schema import DECODE_BATCHES, DECODE_CONTEXTS, PREFILL_LENGTHS, Figure, LayerKindProfile
from libs.weights.tensor import PackedWeight

Clock = Callable[[], float]
K = TypeVar("K", bound=Hashable)
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
    return interleaved_runs({0: call}, runs, min_run_s, clock)[0]


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


@dataclass(frozen=True)
class Timed:
    """One figure's call: its seconds per call over `units` give the figure, in `unit`."""

    call: Callable[[], object]
    units: int
    unit: str


def interleaved_runs(calls: Mapping[K, Callable[[], object]], runs: int, min_run_s: float,
                     clock: Clock = time.perf_counter) -> dict[K, list[float]]:
    """Seconds per call of every call, `runs` samples each, taken round-robin: run r of every call
    before run r + 1 of any, each run sized by its call's warm-up to last `min_run_s`. A slow
    spell of the host then lands in one run of many figures rather than in every run of one, and
    the figures a plan weighs against each other (one layer kind against another, one past
    against the next) are measured side by side in time rather than a minute apart."""
    sizes = {}
    for key, call in calls.items():  # every shape warm (a backend compiling per shape) and sized
        start = clock()
        call()
        sizes[key] = max(1, min(1000, int(min_run_s / max(clock() - start, 1e-9))))
    samples: dict[K, list[float]] = {key: [] for key in calls}
    for _ in range(runs):
        for key, call in calls.items():
            start = clock()
            for _ in range(sizes[key]):
                call()
            samples[key].append((clock() - start) / sizes[key])
    return samples


def measure_calls(timed: Mapping[K, Timed], grid: Grid, clock: Clock = time.perf_counter) -> dict[K, Figure]:
    samples = interleaved_runs({k: t.call for k, t in timed.items()}, grid.runs, grid.min_run_s, clock)
    return {k: per_unit(samples[k], t.units, t.unit) for k, t in timed.items()}


def layer_calls(cfg: DeepseekV2Config, kernels: StageKernels, layer_index: int, grid: Grid) -> dict[tuple, Timed]:
    """One decoder layer's figures: ("prefill", S) per token, ("decode", past, batch) per microbatch."""
    make = InputMaker(cfg, seed=layer_index)
    calls: dict[tuple, Timed] = {("prefill", n): Timed(partial(kernels.decoder_layer, layer_index, make.prefill(n)),
                                                       n, "s/token") for n in grid.prefill_lengths}
    for context in sorted(set(grid.decode_contexts)):
        for batch in grid.decode_batches:
            inputs = make.decode(batch, context)
            calls[("decode", context, batch)] = Timed(partial(kernels.decoder_layer, layer_index, inputs), 1,
                                                      "s/microbatch")
    return calls


def layer_profile(cfg: DeepseekV2Config, weights: StageWeights, layer_index: int, grid: Grid,
                  figures: Mapping[tuple, Figure]) -> LayerKindProfile:
    by_context = {c: {b: figures[("decode", c, b)] for b in grid.decode_batches}
                  for c in sorted(set(grid.decode_contexts))}
    return LayerKindProfile(layer_kind(cfg, layer_index), {n: figures[("prefill", n)] for n in grid.prefill_lengths},
                            by_context[grid.context_tokens], layer_resident_bytes(weights.layer(layer_index)),
                            kv_bytes_per_token(cfg), by_context)


def measure_layer(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, layer_index: int,
                  grid: Grid, clock: Clock = time.perf_counter) -> LayerKindProfile:
    """One decoder layer, timed alone through the stage's kernels."""
    kind = layer_kind(cfg, layer_index)
    return measure_kinds(cfg, kernels, weights, {kind: layer_index}, False, False, grid, clock)[kind]


def embed_calls(cfg: DeepseekV2Config, kernels: StageKernels, grid: Grid) -> dict[tuple, Timed]:
    make = InputMaker(cfg, seed=1000)
    calls = {("prefill", n): Timed(partial(kernels.embed, make.token_ids(n)), n, "s/token")
             for n in grid.prefill_lengths}
    calls.update({("decode", b): Timed(partial(kernels.embed, make.token_ids(b)), 1, "s/microbatch")
                  for b in grid.decode_batches})
    return calls


def _holds_embed(weights: StageWeights) -> None:
    if weights.embed is None:
        raise ValueError("this stage holds no embeddings")


def _holds_head(weights: StageWeights) -> None:
    if weights.lm_head is None or weights.final_norm is None:
        raise ValueError("this stage holds no head")


def embed_profile(weights: StageWeights, grid: Grid, figures: Mapping[tuple, Figure]) -> LayerKindProfile:
    assert weights.embed is not None  # measure_kinds checked it before timing
    return LayerKindProfile("embed", {n: figures[("prefill", n)] for n in grid.prefill_lengths},
                            {b: figures[("decode", b)] for b in grid.decode_batches}, int(weights.embed.nbytes), 0)


def measure_embed(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, grid: Grid,
                  clock: Clock = time.perf_counter) -> LayerKindProfile:
    return measure_kinds(cfg, kernels, weights, {}, True, False, grid, clock)["embed"]


def head_calls(cfg: DeepseekV2Config, kernels: StageKernels, grid: Grid) -> dict[tuple, Timed]:
    """Final norm and lm_head. A prefill computes logits for its last row only (as the executor
    does): one row timed, its cost spread over S per prefill length."""
    make = InputMaker(cfg, seed=2000)
    calls: dict[tuple, Timed] = {("row",): Timed(partial(kernels.final, make.hidden(1)), 1, "s/token")}
    calls.update({("decode", b): Timed(partial(kernels.final, make.hidden(b)), 1, "s/microbatch")
                  for b in grid.decode_batches})
    return calls


def head_profile(weights: StageWeights, grid: Grid, figures: Mapping[tuple, Figure]) -> LayerKindProfile:
    assert weights.lm_head is not None and weights.final_norm is not None  # checked before timing
    row = figures[("row",)]
    prefill = {n: Figure(row.median / n, row.low / n, row.high / n, row.runs, "s/token") for n in grid.prefill_lengths}
    return LayerKindProfile("head", prefill, {b: figures[("decode", b)] for b in grid.decode_batches},
                            int(weights.lm_head.nbytes + weights.final_norm.nbytes), 0)


def measure_head(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, grid: Grid,
                 clock: Clock = time.perf_counter) -> LayerKindProfile:
    return measure_kinds(cfg, kernels, weights, {}, False, True, grid, clock)["head"]


def measure_kinds(cfg: DeepseekV2Config, kernels: StageKernels, weights: StageWeights, layers: Mapping[str, int],
                  embed: bool, head: bool, grid: Grid, clock: Clock = time.perf_counter) -> dict[str, LayerKindProfile]:
    """The layer kinds `layers` (kind -> its first layer), the embeddings and the head, every
    figure of all of them interleaved in one pass (`interleaved_runs`)."""
    if embed:
        _holds_embed(weights)
    if head:
        _holds_head(weights)
    timed: dict[tuple, Timed] = {}
    for kind, layer in layers.items():
        timed.update({(kind, *k): t for k, t in layer_calls(cfg, kernels, layer, grid).items()})
    if embed:
        timed.update({("embed", *k): t for k, t in embed_calls(cfg, kernels, grid).items()})
    if head:
        timed.update({("head", *k): t for k, t in head_calls(cfg, kernels, grid).items()})
    figures = measure_calls(timed, grid, clock)

    def of(kind: str) -> dict[tuple, Figure]:
        return {k[1:]: f for k, f in figures.items() if k[0] == kind}

    profiles = {kind: layer_profile(cfg, weights, layer, grid, of(kind)) for kind, layer in layers.items()}
    if embed:
        profiles["embed"] = embed_profile(weights, grid, of("embed"))
    if head:
        profiles["head"] = head_profile(weights, grid, of("head"))
    return profiles


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
