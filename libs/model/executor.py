"""Backend-agnostic stage executor: ragged batches through a contiguous layer range.

One call runs several sequences, each at its own position, prefill and decode mixed. Rows
of the batch are the sequences' new tokens in slice order. The executor builds RoPE tables
and the additive attention mask on the host, gathers each sequence's cached KV, calls the
kernels layer by layer, and commits the new KV only after every layer has succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from libs.fnx2 import SequenceSlice
from libs.model.config import DeepseekV2Config
from libs.model.errors import BatchError
from libs.model.kernels import MASK_NEG, LayerInputs, StageKernels
from libs.model.kv_blocks import require_kv_backend
from libs.model.kv_store import KvLayout, KvStore, KvUsage
from libs.model.rope import rope_tables
from libs.model.sampling import SamplingParams, TokenFilter, sample_token


@dataclass(frozen=True)
class StageSpec:
    """Layers [layer_start, layer_end) of the model; first/last say who owns embed/head."""

    layer_start: int
    layer_end: int
    first: bool
    last: bool
    kv_limit_bytes: int = 1 << 30
    kv_dtype: str = "fp32"  # libs.model.kv_blocks.KV_DTYPES


@dataclass(frozen=True)
class StageBatch:
    slices: tuple[SequenceSlice, ...]
    token_ids: np.ndarray | None = None          # int32 [R], first stage
    hidden: np.ndarray | None = None             # float32 [R, hidden], later stages
    sampling: tuple[SamplingParams, ...] = ()    # one per slice, last stage; empty = no sampling
    # One per slice when given (grammar masks, bias, penalties); None entries sample plainly.
    token_filters: tuple[TokenFilter | None, ...] = ()
    all_logits: bool = False                     # last stage: logits for every row, not just the last

    @property
    def row_count(self) -> int:
        return sum(s.input_row_count for s in self.slices)


@dataclass(frozen=True)
class StageResult:
    hidden: np.ndarray                           # float32 [R, hidden] after the stage's last layer
    logits: np.ndarray | None                    # float32 [R or S, vocab] (last stage)
    token_ids: np.ndarray | None                 # int32 [S] sampled tokens (last stage, if asked)
    routed_expert_ids: tuple[tuple[int, np.ndarray], ...] = field(default=())  # (layer, int32 [R, k])
    kv_epochs_before: tuple[int, ...] = ()
    kv_epochs_after: tuple[int, ...] = ()


@dataclass(frozen=True)
class PendingKv:
    """New KV rows of a run batch, not yet in the store: [layers, rows, dim], slice order."""

    slices: tuple[SequenceSlice, ...]
    latent: np.ndarray
    k_rope: np.ndarray


@dataclass(frozen=True)
class RaggedLayout:
    positions: np.ndarray  # int64 [R]
    mask: np.ndarray       # float32 [R, P + R]


def build_ragged_layout(past_lengths: list[int], row_counts: list[int]) -> RaggedLayout:
    """Positions and the additive mask: each row sees its own sequence's past and earlier rows."""
    seq_rows = np.repeat(np.arange(len(row_counts)), row_counts)
    offsets = np.repeat(np.cumsum([0] + row_counts[:-1]), row_counts)
    positions = np.repeat(past_lengths, row_counts) + (np.arange(len(seq_rows)) - offsets)
    past_seq = np.repeat(np.arange(len(past_lengths)), past_lengths)
    past_starts = np.repeat(np.cumsum([0] + past_lengths[:-1]), past_lengths).astype(np.int64)
    past_pos = np.arange(past_seq.size) - past_starts
    key_seq = np.concatenate([past_seq, seq_rows])
    key_pos = np.concatenate([past_pos, positions])
    allowed = (key_seq[None, :] == seq_rows[:, None]) & (key_pos[None, :] <= positions[:, None])
    mask = np.where(allowed, np.float32(0), MASK_NEG).astype(np.float32)
    return RaggedLayout(positions.astype(np.int64), np.ascontiguousarray(mask))


class StageExecutor:
    def __init__(self, cfg: DeepseekV2Config, spec: StageSpec, kernels: StageKernels) -> None:
        require_kv_backend(spec.kv_dtype, kernels.name, field="kv_dtype")  # KV_DTYPE / KV_DTYPE_BACKEND
        if not 0 <= spec.layer_start < spec.layer_end <= cfg.num_hidden_layers:
            raise BatchError(f"layer range [{spec.layer_start}, {spec.layer_end}) is outside the model")
        self.cfg = cfg
        self.spec = spec
        self.kernels = kernels
        self.rope = rope_tables(cfg)
        layout = KvLayout(spec.layer_end - spec.layer_start, cfg.kv_lora_rank, cfg.qk_rope_head_dim, spec.kv_dtype)
        self.kv = KvStore(layout, spec.kv_limit_bytes)

    def kv_usage(self) -> KvUsage:
        return self.kv.usage()

    def release(self, request_id: str, lease_id: str) -> bool:
        return self.kv.release(request_id, lease_id)

    def release_request(self, request_id: str) -> int:
        """Release every lease of a request; returns how many held KV."""
        return self.kv.release_request(request_id)

    def execute(self, batch: StageBatch) -> StageResult:
        """Run the batch and commit every sequence's new KV."""
        result, pending = self.run(batch)
        return replace(result, kv_epochs_after=self.commit(pending))

    def run(self, batch: StageBatch) -> tuple[StageResult, PendingKv]:
        """Run the batch without touching the KV store; `commit` applies the new rows later.

        A stage that forwards its output commits only the sequences the rest of the pipeline
        also completed, so a failure further on leaves this stage's epoch where it was.
        """
        slices = list(batch.slices)
        if not slices:
            raise BatchError("a batch needs at least one slice")
        self.kv.check_batch(slices)
        hidden = self._input_hidden(batch)
        layout = build_ragged_layout([s.token_position_start for s in slices], [s.input_row_count for s in slices])
        cos, sin = self.rope.cos_sin(layout.positions)
        new_latent, new_k_rope, experts = [], [], []
        for layer in range(self.spec.layer_start, self.spec.layer_end):
            out = self.kernels.decoder_layer(layer, self._layer_inputs(layer, slices, hidden, cos, sin, layout))
            hidden = out.hidden
            new_latent.append(out.new_latent)
            new_k_rope.append(out.new_k_rope)
            if out.routed_expert_ids is not None:
                experts.append((layer, out.routed_expert_ids))
        logits, tokens = self._finish(batch, hidden, layout)
        before = tuple(s.kv_epoch for s in slices)
        result = StageResult(
            hidden=hidden, logits=logits, token_ids=tokens,
            routed_expert_ids=tuple(experts), kv_epochs_before=before, kv_epochs_after=before,
        )
        return result, PendingKv(tuple(slices), np.stack(new_latent), np.stack(new_k_rope))

    def commit(self, pending: PendingKv, request_ids: frozenset[str] | None = None) -> tuple[int, ...]:
        """Append the pending rows of the named requests (all when None) and advance their epochs.

        Returns each slice's epoch afterwards, in slice order (unchanged where not committed).
        """
        epochs, row = [], 0
        for s in pending.slices:
            end = row + s.input_row_count
            if request_ids is None or s.request_id in request_ids:
                epochs.append(self.kv.commit(s, pending.latent[:, row:end], pending.k_rope[:, row:end]))
            else:
                epochs.append(s.kv_epoch)
            row = end
        return tuple(epochs)

    def _input_hidden(self, batch: StageBatch) -> np.ndarray:
        rows = batch.row_count
        if self.spec.first:
            if batch.token_ids is None or batch.token_ids.shape != (rows,):
                raise BatchError(f"the first stage needs token_ids of shape ({rows},)")
            ids = batch.token_ids
            if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
                raise BatchError(f"token ids must lie in [0, {self.cfg.vocab_size})")
            return self.kernels.embed(np.ascontiguousarray(ids, dtype=np.int32))
        expected = (rows, self.cfg.hidden_size)
        if batch.hidden is None or batch.hidden.shape != expected:
            raise BatchError(f"this stage needs float32 hidden states of shape {expected}")
        return np.ascontiguousarray(batch.hidden, dtype=np.float32)

    def _layer_inputs(self, layer, slices, hidden, cos, sin, layout) -> LayerInputs:
        local = layer - self.spec.layer_start
        pasts = [self.kv.past(s, local) for s in slices]
        return LayerInputs(
            hidden=hidden, rope_cos=cos, rope_sin=sin,
            past_latent=np.ascontiguousarray(np.concatenate([p[0] for p in pasts], axis=0)),
            past_k_rope=np.ascontiguousarray(np.concatenate([p[1] for p in pasts], axis=0)),
            mask=layout.mask,
        )

    def _finish(self, batch: StageBatch, hidden: np.ndarray, layout: RaggedLayout):
        if not self.spec.last:
            return None, None
        last_rows = np.cumsum([s.input_row_count for s in batch.slices]) - 1
        logits = self.kernels.final(hidden if batch.all_logits else np.ascontiguousarray(hidden[last_rows]))
        last_logits = logits[last_rows] if batch.all_logits else logits
        tokens = None
        if batch.sampling:
            if len(batch.sampling) != len(batch.slices):
                raise BatchError("sampling needs one parameter set per slice")
            positions = layout.positions[last_rows]
            filters = batch.token_filters or (None,) * len(batch.slices)
            if len(filters) != len(batch.slices):
                raise BatchError("token filters need one entry per slice")
            tokens = np.array(
                [sample_token(row, p, int(pos), f)
                 for row, p, pos, f in zip(last_logits, batch.sampling, positions, filters, strict=True)],
                dtype=np.int32,
            )
        return logits, tokens
