"""The per-microbatch step overhead of a served decode step, measured on this worker.

A stage profile times each layer kind alone. A served decode microbatch pays more than its
layers: the data plane turns the received FNX2 activation tensor into float32 rows (unpack),
the executor checks every slice against the KV store, gathers each sequence's past, builds the
ragged mask and rope positions, samples on the head stage, and appends the new KV rows
(commit); a middle stage packs its boundary tensor for the next hop. This module runs exactly
that path (`StageExecutor.run` + `commit`, and the data plane's own unpack and pack helpers)
over the profiled layer range, `batch` sequences each holding `context` tokens of KV, and
subtracts the measured layer, embed and head times of the same run's grid at the same past:

    step overhead(context, batch) = served step time(context, batch)
                                    - sum of its parts' decode figures(context, batch)

at every past of the grid's context grid (the KV gather and the mask grow with it). One sample
per run; every run starts from fresh KV at `context` tokens and advances at most
`MAX_STEPS_PER_RUN` tokens, so the context stays the grid's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from libs.fnx2.wire.tensor import DType, Tensor, TensorKind
from libs.model.config import DeepseekV2Config
from libs.model.executor import StageBatch, StageExecutor, StageSpec
from libs.model.kernels import StageKernels
from libs.model.kv_store import kv_slice
from libs.model.sampling import SamplingParams
from libs.profiles.measure import Grid, layer_kind
from libs.profiles.schema import Figure, LayerKindProfile

Clock = Callable[[], float]
MAX_STEPS_PER_RUN = 32
KV_LIMIT_BYTES = 1 << 40  # the profile's own store; the grid bounds what it holds


def _layer_decode(kind: LayerKindProfile, context: int | None) -> dict[int, Figure]:
    if context is None or not kind.decode_s_by_context:
        return kind.decode_s_per_microbatch
    return kind.decode_s_by_context[context]


def parts_decode_s(kinds: dict[str, LayerKindProfile], cfg: DeepseekV2Config, layer_start: int, layer_end: int,
                   first: bool, last: bool, batch: int, context: int | None = None) -> float:
    """Sum of the measured decode medians of a range's layers (and embed, head) at `batch` rows,
    the layers' at `context` tokens of past (None: their plain figures)."""
    total = sum(_layer_decode(kinds[layer_kind(cfg, i)], context)[batch].median
                for i in range(layer_start, layer_end))
    if first:
        total += kinds["embed"].decode_s_per_microbatch[batch].median
    if last:
        total += kinds["head"].decode_s_per_microbatch[batch].median
    return total


class _ServedSteps:
    """`batch` sequences decoding one token per step through a private executor."""

    def __init__(self, cfg: DeepseekV2Config, kernels: StageKernels, spec: StageSpec, batch: int, context: int,
                 run: int):
        self.cfg, self.spec, self.batch = cfg, spec, batch
        self.executor = StageExecutor(cfg, spec, kernels)
        rng = np.random.default_rng(run)
        layers = spec.layer_end - spec.layer_start
        self.slices = []
        for i in range(batch):
            seed = kv_slice(f"profile-step-{run}-{i}", f"lease-{run}", 0, 0, 0, max(context, 1))
            rows = seed.input_row_count
            latent = (rng.standard_normal((layers, rows, cfg.kv_lora_rank)) * 0.5).astype(np.float32)
            k_rope = (rng.standard_normal((layers, rows, cfg.qk_rope_head_dim)) * 0.5).astype(np.float32)
            epoch = self.executor.kv.commit(seed, latent, k_rope)
            self.slices.append(kv_slice(seed.request_id, seed.execution_lease_id, 1, rows, epoch, 1))
        self.token_ids = rng.integers(0, cfg.vocab_size, batch, dtype=np.int32)
        hidden = (rng.standard_normal((batch, cfg.hidden_size)) * 0.5).astype(np.float32)
        self.received = Tensor.from_array(TensorKind.ACTIVATION, DType.FP32, hidden)
        self.sampling = tuple(SamplingParams() for _ in range(batch)) if spec.last else ()

    def step(self) -> None:
        slices = tuple(self.slices)
        if self.spec.first:
            batch = StageBatch(slices, token_ids=self.token_ids, sampling=self.sampling)
        else:  # the data plane's unpack of the received activation rows
            rows = self.received.rows(0, self.batch)
            hidden = Tensor(self.received.descriptor.with_rows(rows.shape[0]), rows).to_float32()
            batch = StageBatch(slices, hidden=hidden, sampling=self.sampling)
        result, pending = self.executor.run(batch)
        if not self.spec.last:  # the data plane's pack of the boundary tensor
            Tensor.from_array(TensorKind.ACTIVATION, DType.FP32, np.ascontiguousarray(result.hidden, np.float32))
        epochs = self.executor.commit(pending)
        self.slices = [s._replace(request_sequence_no=s.request_sequence_no + 1,
                                  token_position_start=s.token_position_start + 1, kv_epoch=e, input_row_count=1)
                       for s, e in zip(slices, epochs, strict=True)]


def measure_step_overhead(cfg: DeepseekV2Config, kernels: StageKernels, layer_start: int, layer_end: int,
                          first: bool, last: bool, kinds: dict[str, LayerKindProfile], grid: Grid,
                          clock: Clock = time.perf_counter) -> dict[int, dict[int, list[float]]]:
    """Overhead samples (seconds per microbatch, one per run): context -> batch -> samples."""
    return {context: _step_overhead_at(cfg, kernels, layer_start, layer_end, first, last, kinds, grid, context, clock)
            for context in sorted(set(grid.decode_contexts))}


def _step_overhead_at(cfg: DeepseekV2Config, kernels: StageKernels, layer_start: int, layer_end: int, first: bool,
                      last: bool, kinds: dict[str, LayerKindProfile], grid: Grid, context: int,
                      clock: Clock) -> dict[int, list[float]]:
    spec = StageSpec(layer_start, layer_end, first, last, KV_LIMIT_BYTES)
    out: dict[int, list[float]] = {}
    for batch in grid.decode_batches:
        parts = parts_decode_s(kinds, cfg, layer_start, layer_end, first, last, batch, context)
        warm = _ServedSteps(cfg, kernels, spec, batch, context, run=0)
        start = clock()
        warm.step()
        first_s = max(clock() - start, 1e-9)
        steps = max(1, min(MAX_STEPS_PER_RUN, int(grid.min_run_s / first_s)))
        samples = []
        for run in range(1, grid.runs + 1):
            served = _ServedSteps(cfg, kernels, spec, batch, context, run)
            start = clock()
            for _ in range(steps):
                served.step()
            samples.append((clock() - start) / steps - parts)
        out[batch] = samples
    return out


def step_figures(per_source: Sequence[dict[int, list[float]]]) -> dict[int, Figure]:
    """One figure per batch size over every source's runs. A negative sample (the step ran faster
    than its parts timed alone, inside this host's noise) stays as measured."""
    batches = sorted({b for source in per_source for b in source})
    return {b: Figure.of([s for source in per_source for s in source.get(b, [])], "s/microbatch") for b in batches}


def step_grid_figures(per_source: Sequence[dict[int, dict[int, list[float]]]]) -> dict[int, dict[int, Figure]]:
    """context -> batch -> figure over every source's runs at that past."""
    contexts = sorted({c for source in per_source for c in source})
    return {c: step_figures([source[c] for source in per_source if c in source]) for c in contexts}
