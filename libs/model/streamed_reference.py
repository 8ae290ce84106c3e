"""Teacher-forced logits of the whole model, one decoder layer at a time, with Hugging Face
transformers' own DeepSeek-V2 modules: the reference at sizes whose float32 model does not fit
in memory (DeepSeek-V2-Lite: 63 GB as float32).

Every sequence is embedded; then for each layer in order, that one `DeepseekV2DecoderLayer` is
built on the meta device (no random init), given its weights decoded to float32 with
`load_state_dict(assign=True)`, run over every sequence's full hidden states (causal, positions
0..L-1, the model's own RoPE / yarn tables and causal mask), and freed before the next is built.
The final norm and head come last. A caller may keep the hidden states after chosen layers (a
stage boundary: [positions, hidden] per sequence) and every MoE layer's routed expert ids, which
are small beside a layer's weights. At most one dequantized layer is held (the embeddings and
the head each alone, before and after the layers), so peak memory is about one layer's float32
bytes over the process's baseline, not the model's.

The weights come from a `WeightSource`: the stage artifacts a route was built into (each
tensor in its stored format, decoded here) or a checkpoint with a weight policy (each tensor
encoded in memory as the artifact builder would, then decoded). Either way each tensor goes
through `libs.model.weights` and `libs.weights.tensor.dense`, the decode path every other
reference of quantized weights uses (`libs.model.bench_transformers`).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from libs.model.bench_transformers import hf_layer_state
from libs.model.config import DeepseekV2Config, load_config
from libs.model.errors import CheckpointError
from libs.model.parity import check_reference_supports, router_expert_ids
from libs.model.weights import load_stage_weights
from libs.weights.policy import DEFAULT_POLICY
from libs.weights.tensor import dense, rows_of

EXPERTS_IMPLEMENTATION = "eager"


class ReferenceSourceError(CheckpointError):
    """The stage artifacts given do not make one whole model (a layer missing or held twice)."""

    default_reason = "REFERENCE_SOURCE_INCOMPLETE"


@dataclass(frozen=True)
class WeightSource:
    """Where each layer's weights are read: directories, each holding layers [start, end) (a
    stage artifact, or the whole checkpoint), in layer order. `policy` encodes a plain float
    tensor in memory as the artifact builder would for a stage of `backend`; a tensor an
    artifact stores packed is read as stored (the policy does not touch it)."""

    ranges: tuple[tuple[int, int, Path], ...]
    policy: str = DEFAULT_POLICY
    backend: str = "numpy"
    description: str = ""

    @property
    def config_dir(self) -> Path:
        return self.ranges[0][2]

    def directory_of(self, layer_index: int) -> Path:
        for start, end, path in self.ranges:
            if start <= layer_index < end:
                return path
        raise ReferenceSourceError(f"no directory of the reference holds layer {layer_index}")


def checkpoint_source(checkpoint_dir: Path, policy: str = DEFAULT_POLICY, backend: str = "numpy") -> WeightSource:
    """A checkpoint, each tensor encoded by `policy` (for a stage of `backend`) and decoded."""
    layers = load_config(checkpoint_dir).num_hidden_layers
    on = "" if policy == "fp32" else f" encoded as {policy} for {backend} (as the builder would), decoded"
    return WeightSource(((0, layers, Path(checkpoint_dir)),), policy, backend,
                        f"checkpoint {checkpoint_dir}{on}")


def artifact_source(stage_dirs: Sequence[Path]) -> WeightSource:
    """Stage artifacts in stage order, each tensor as stored, decoded to float32."""
    from libs.artifacts.manifest import MANIFEST_FILE, decode_manifest

    ranges = []
    for path in stage_dirs:
        span = decode_manifest((Path(path) / MANIFEST_FILE).read_bytes()).layers
        ranges.append((span.layer_start, span.layer_end, Path(path)))
    ranges.sort(key=lambda r: r[0])
    layers = load_config(ranges[0][2]).num_hidden_layers if ranges else 0
    expected = 0
    for start, end, path in ranges:
        if start != expected:
            raise ReferenceSourceError(f"the stage artifacts leave layers [{expected}, {start}) uncovered "
                                       f"or cover them twice (next: {path} with [{start}, {end}))")
        expected = end
    if not ranges or expected != layers:
        raise ReferenceSourceError(f"the stage artifacts cover layers [0, {expected}) of {layers}")
    return WeightSource(tuple(ranges), description=f"{len(ranges)} stage artifacts, tensors as stored, decoded")


@dataclass(frozen=True)
class StreamedLogits:
    """Per sequence, in input order: the argmax id at every position, and (when kept) the
    float32 logits [positions, vocab]."""

    top1: tuple[np.ndarray, ...]
    logits: tuple[np.ndarray, ...] | None
    reference: str
    seconds: float
    peak_rss_bytes: int           # the process's lifetime peak, read when the run ended
    baseline_rss_bytes: int       # the process's peak before the first weight was read
    largest_layer_f32_bytes: int  # the largest decoded layer the run held
    # Layer index -> per sequence, the float32 hidden states [positions, hidden] after that layer
    # (only the layers asked for).
    hidden_after: dict[int, tuple[np.ndarray, ...]] = field(default_factory=dict)
    # MoE layer index -> per sequence, the routed expert ids [positions, top_k] (when asked for).
    expert_ids: dict[int, tuple[np.ndarray, ...]] = field(default_factory=dict)

    @property
    def growth_bytes(self) -> int:
        return self.peak_rss_bytes - self.baseline_rss_bytes


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def streamed_logits(source: WeightSource, sequences: Sequence[Sequence[int]], keep_logits: bool = False,
                    progress: Callable[[str], None] | None = None, hidden_after: Sequence[int] = (),
                    expert_ids: bool = False) -> StreamedLogits:
    """Teacher-forced logits of each sequence (every position sees its own prefix only); with
    `hidden_after`, the hidden states after those layers; with `expert_ids`, each MoE layer's
    routed experts per position."""
    import torch
    import transformers

    cfg = load_config(source.config_dir)
    check_reference_supports(cfg)
    _check_ids(cfg, sequences)
    _check_layers(cfg, hidden_after)
    runner = _LayerRunner(cfg, source)
    baseline = peak_rss_bytes()
    started = time.perf_counter()
    kept: dict[int, tuple[np.ndarray, ...]] = {}
    routed: dict[int, tuple[np.ndarray, ...]] = {}
    with torch.no_grad():
        hidden = runner.embed(sequences)
        frames = [runner.frame(h) for h in hidden]
        largest = 0
        for index in range(cfg.num_hidden_layers):
            layer, held = runner.layer(index)
            largest = max(largest, held)
            seen: list[np.ndarray] = []
            hook = (layer.mlp.gate.register_forward_hook(_expert_ids_hook(seen))
                    if expert_ids and cfg.is_moe_layer(index) else None)
            hidden = [layer(h, attention_mask=mask, position_embeddings=rope) for h, (mask, rope) in
                      zip(hidden, frames, strict=True)]
            if hook is not None:
                hook.remove()
                routed[index] = tuple(seen)
            if index in hidden_after:
                kept[index] = tuple(h[0].numpy().copy() for h in hidden)
            del layer
            if progress:
                progress(f"layer {index + 1}/{cfg.num_hidden_layers} ({held / 2**20:.0f} MiB float32)")
        top1, logits = runner.head(hidden, keep_logits)
    reference = (f"transformers {transformers.__version__} DeepseekV2DecoderLayer one layer at a time "
                 f"(eager attention, experts {runner.experts_implementation}), float32, torch {torch.__version__} "
                 f"CPU; weights: {source.description}")
    return StreamedLogits(top1, logits, reference, time.perf_counter() - started, peak_rss_bytes(), baseline,
                          largest, kept, routed)


def _check_layers(cfg: DeepseekV2Config, layers: Sequence[int]) -> None:
    outside = [i for i in layers if not 0 <= i < cfg.num_hidden_layers]
    if outside:
        raise ReferenceSourceError(f"hidden_after names layers {outside} outside [0, {cfg.num_hidden_layers})",
                                   reason="REFERENCE_LAYER_INVALID")


def _expert_ids_hook(store: list[np.ndarray]):
    """Appends the router's chosen expert ids [positions, top_k] of each sequence it runs on."""
    def hook(_module, _inputs, output):
        store.append(router_expert_ids(output))

    return hook


def _check_ids(cfg: DeepseekV2Config, sequences: Sequence[Sequence[int]]) -> None:
    for index, ids in enumerate(sequences):
        if not ids:
            raise ReferenceSourceError(f"sequence {index} is empty", reason="REFERENCE_SEQUENCE_INVALID")
        if min(ids) < 0 or max(ids) >= cfg.vocab_size:
            raise ReferenceSourceError(f"sequence {index} holds an id outside [0, {cfg.vocab_size})",
                                       reason="REFERENCE_SEQUENCE_INVALID")
        if len(ids) > cfg.max_position_embeddings:
            raise ReferenceSourceError(f"sequence {index} is {len(ids)} long, past the model's "
                                       f"{cfg.max_position_embeddings} positions", reason="REFERENCE_SEQUENCE_INVALID")


class _LayerRunner:
    """Transformers' modules for one model, built one at a time from `source`."""

    def __init__(self, cfg: DeepseekV2Config, source: WeightSource):
        import torch
        import transformers

        self.cfg, self.source = cfg, source
        hf_cfg = transformers.AutoConfig.from_pretrained(str(source.config_dir))
        # A meta-device shell of the whole model resolves the config as from_pretrained does and
        # holds no weights. Experts run transformers' eager loop over the experts hit: the same
        # products as its default grouped_mm, which on CPU measured 0.2 s per call on `small`
        # (most of the reference's time) against a few ms.
        with torch.device("meta"):
            shell = transformers.AutoModelForCausalLM.from_config(
                hf_cfg, attn_implementation="eager", experts_implementation=EXPERTS_IMPLEMENTATION,
                dtype=torch.float32)
        self.hf_cfg = shell.config
        self.layer_class = type(shell.model.layers[0])
        self.norm_class = type(shell.model.norm)
        self.rotary = type(shell.model.rotary_emb)(self.hf_cfg)  # on CPU: its tables are computed
        self.experts_implementation = getattr(self.hf_cfg, "_experts_implementation", "eager")

    def embed(self, sequences: Sequence[Sequence[int]]) -> list:
        import torch

        stage = self._load(self.source.ranges[0][0], self.source.ranges[0][0], first=True, last=False)
        if stage.embed is None:
            raise ReferenceSourceError(f"{self.source.ranges[0][2]} holds no embeddings")
        return [torch.from_numpy(np.ascontiguousarray(rows_of(stage.embed, np.asarray(ids, dtype=np.int64))))[None]
                for ids in sequences]

    def frame(self, hidden):
        """The causal mask and rotary tables of one sequence at positions 0..L-1, as the model builds them."""
        import torch
        from transformers.masking_utils import create_causal_mask

        positions = torch.arange(hidden.shape[1])[None]
        mask = create_causal_mask(config=self.hf_cfg, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=positions)
        return mask, self.rotary(hidden, positions)

    def layer(self, index: int):
        """Decoder layer `index` with its weights decoded to float32, and their bytes."""
        import torch

        stage = self._load(index, index + 1, first=False, last=False)
        state = hf_layer_state(stage.layer(index))
        del stage
        held = sum(int(v.nbytes) for v in state.values())
        with torch.device("meta"):
            module = self.layer_class(self.hf_cfg, index)
        module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True, assign=True)
        return module.eval(), held

    def head(self, hidden: list, keep_logits: bool) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...] | None]:
        import torch

        end = self.source.ranges[-1][1]
        stage = self._load(end, end, first=False, last=True)
        if stage.final_norm is None or stage.lm_head is None:
            raise ReferenceSourceError(f"{self.source.ranges[-1][2]} holds no final norm and head")
        with torch.device("meta"):
            norm = self.norm_class(self.cfg.hidden_size, eps=self.cfg.rms_norm_eps)
        norm.load_state_dict({"weight": torch.from_numpy(stage.final_norm)}, assign=True)
        weight = torch.from_numpy(np.ascontiguousarray(dense(stage.lm_head)))
        del stage
        top1, kept = [], []
        for h in hidden:
            logits = torch.nn.functional.linear(norm(h), weight)[0]
            top1.append(logits.argmax(-1).numpy().astype(np.int64))
            if keep_logits:
                kept.append(logits.numpy().copy())
        return tuple(top1), tuple(kept) if keep_logits else None

    def _load(self, start: int, end: int, first: bool, last: bool):
        directory = self.source.directory_of(min(start, self.cfg.num_hidden_layers - 1))
        return load_stage_weights(directory, self.cfg, start, end, first, last, policy=self.source.policy,
                                  backend=self.source.backend)
