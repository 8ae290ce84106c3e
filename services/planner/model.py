"""Per-layer cost facts of a DeepSeek-V2-family checkpoint, derived from its config.json.

Byte counts are exact for the Hugging Face `DeepseekV2ForCausalLM` tensor layout
(`libs.model.layout`). Given a weight policy (`libs.weights.policy`) each tensor counts in the
format the policy gives it, as the artifact builder writes it and a stage holds it (fp32 is 4
bytes a weight whatever the checkpoint's dtype); without one, at the checkpoint's dtype.
FLOPs count two per multiply-accumulate of the weights a decode token
actually touches: dense parts, the router, the shared experts and only the top-k routed
experts. Attention score work grows with context and is kept as a separate per-context-token
term. KV bytes per token are MLA's compressed latent plus the rope key:
`(kv_lora_rank + qk_rope_head_dim) * dtype bytes` per layer: float32 (what stages hold) under a
policy, the checkpoint's dtype without one. A named KV dtype (`libs.model.kv_blocks.KV_DTYPES`)
counts its own format exactly: fp8 is `kv_lora_rank * 1 + qk_rope_head_dim * 2` bytes a token
plus `kv_scale_bytes_per_block` (4) per 16-token block, per layer.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.common.kinds import DType
from libs.model.config import DeepseekV2Config, parse_config
from libs.model.errors import ConfigError
from libs.model.kv_blocks import KvFormat, kv_format
from libs.model.layout import EMBED, FINAL_NORM, LM_HEAD, layer_tensors
from libs.weights.policy import policy_formats, require_policy
from services.planner.policy_bytes import LayerBytes, layer_bytes, matrix_bytes

DTYPE_BYTES = {DType.BF16: 2, DType.FP16: 2, DType.FP32: 4}
KV_DTYPE_BYTES = 4  # stages keep MLA latents and rope keys in float32
_TORCH_DTYPES = {"bfloat16": DType.BF16, "float16": DType.FP16, "float32": DType.FP32}

# Operation names a node must list to host a stage of this model family.
BASE_OPERATIONS = ("embedding", "rmsnorm", "mla_attention", "rope", "swiglu", "lm_head")
MOE_OPERATIONS = ("moe_router_softmax_topk",)
YARN_OPERATION = "rope_yarn"


@dataclass(frozen=True)
class LayerCost:
    """Cost facts of one decoder layer. Bytes are stored weight bytes at the model dtype."""

    index: int
    is_moe: bool
    weight_bytes: int  # every weight of the layer, all routed experts included
    dense_weight_bytes: int  # everything except the routed experts
    flops_per_token: int  # weight matmuls a token touches (top-k experts only)
    attention_flops_per_context_token: int  # score + value work per cached token
    kv_bytes_per_token: int  # latent + rope key of one token (scales excluded)
    scratch_bytes_per_row: int  # widest fp32 intermediate of the layer, per row
    # Per 16-token KV block (libs.model.kv_blocks.KV_BLOCK_TOKENS): the fp8 latent's scale; 0 unscaled.
    kv_scale_bytes_per_block: int = 0

    def active_weight_bytes_per_token(self, expert_bytes: int, experts_per_token: int) -> int:
        if not self.is_moe:
            return self.dense_weight_bytes
        return self.dense_weight_bytes + expert_bytes * experts_per_token


@dataclass(frozen=True)
class ModelDescription:
    model_snapshot: str  # "sha256:<hex>" of config.json (+ the weight index when present)
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerCost, ...]
    embedding_bytes: int
    head_bytes: int  # final norm + LM head (the embedding matrix again when tied)
    tied_embeddings: bool
    routed_experts: int
    experts_per_token: int
    shared_experts: int
    expert_bytes: int  # one routed expert (gate, up, down)
    weight_dtype: DType  # one of FLOAT_DTYPES
    required_operations: tuple[str, ...]
    weights_policy: str = ""  # "" = counted at the checkpoint's dtype
    # (backend, formats a stage of that backend holds under the policy); () = no policy
    weight_formats: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def formats_for(self, backend: str) -> tuple[str, ...]:
        return dict(self.weight_formats).get(backend, ())

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def head_flops_per_token(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    @property
    def total_weight_bytes(self) -> int:
        shared = self.embedding_bytes if self.tied_embeddings else 0
        return sum(x.weight_bytes for x in self.layers) + self.embedding_bytes + self.head_bytes - shared


def describe_checkpoint(checkpoint_dir: str | Path, policy: str | None = None) -> ModelDescription:
    """Reads `config.json` (and hashes it with the weight index) into a description."""
    root = Path(checkpoint_dir)
    if root.suffix == ".gguf" and root.is_file():
        return _describe_gguf(root, policy)
    config_path = root / "config.json"
    try:
        raw_bytes = config_path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"no config.json in checkpoint dir {root}") from exc
    digest = hashlib.sha256(raw_bytes)
    index_path = root / "model.safetensors.index.json"
    if index_path.exists():
        digest.update(index_path.read_bytes())
    try:
        raw = json.loads(raw_bytes)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path} is not valid JSON: {exc}") from exc
    return describe_config(raw, snapshot="sha256:" + digest.hexdigest(), policy=policy)


def _describe_gguf(path: Path, policy: str | None) -> ModelDescription:
    """A GGUF: its config from the metadata (hashed as the derived config.json), its bytes counted
    as `policy`, or as the policy nearest the bits per weight the file stores."""
    from libs.model.gguf_source import config_from_metadata, config_json_bytes, planning_policy, read_gguf

    metadata, tensors = read_gguf(str(path))
    raw = config_from_metadata(metadata, {t.name for t in tensors})
    snapshot = "sha256:" + hashlib.sha256(config_json_bytes(raw)).hexdigest()
    return describe_config(raw, snapshot, policy or planning_policy(str(path))[0])


def describe_config(raw: dict[str, Any], snapshot: str, policy: str | None = None,
                    kv_dtype: str | None = None) -> ModelDescription:
    """`kv_dtype` (libs.model.kv_blocks.KV_DTYPES) is the stages' KV element type; None keeps the
    default memory term (float32 KV under a weight policy, else the weights' dtype)."""
    cfg = parse_config(raw)
    dtype = weight_dtype_of(raw)
    if policy is not None:
        require_policy(policy)
        dtype = DType.BF16 if policy == "bf16" else DType.FP32
    sizes = _Sizes(cfg, policy, DTYPE_BYTES[dtype])
    if kv_dtype is not None:
        sizes.kv_format = kv_format(kv_dtype, field="kv_dtype")
    n = cfg.num_hidden_layers
    layers = tuple(_layer_cost(cfg, i, sizes) for i in range(n))
    embed = sizes.matrix(EMBED, cfg.vocab_size, cfg.hidden_size)
    head = cfg.hidden_size * sizes.norm_bytes + (embed if cfg.tie_word_embeddings
                                                 else sizes.matrix(LM_HEAD, cfg.vocab_size, cfg.hidden_size))
    moe_layers = [sizes.layer(i) for i in range(n) if cfg.is_moe_layer(i)]
    ops = list(BASE_OPERATIONS)
    if any(x.is_moe for x in layers):
        ops.extend(MOE_OPERATIONS)
    if cfg.rope.rope_type == "yarn":
        ops.append(YARN_OPERATION)
    return ModelDescription(
        model_snapshot=snapshot,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        layers=layers,
        embedding_bytes=embed,
        head_bytes=head,
        tied_embeddings=cfg.tie_word_embeddings,
        routed_experts=cfg.n_routed_experts,
        experts_per_token=cfg.num_experts_per_tok,
        shared_experts=cfg.n_shared_experts,
        expert_bytes=(sum(x.per_expert for x in moe_layers) // len(moe_layers)) if moe_layers else 0,
        weight_dtype=dtype,
        required_operations=tuple(ops),
        weights_policy=policy or "",
        weight_formats=_formats_by_backend(cfg, policy) if policy is not None else (),
    )


def _formats_by_backend(cfg: DeepseekV2Config, policy: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    tensors = {EMBED: (cfg.vocab_size, cfg.hidden_size), FINAL_NORM: (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        tensors[LM_HEAD] = (cfg.vocab_size, cfg.hidden_size)
    for index in range(cfg.num_hidden_layers):
        tensors.update(layer_tensors(cfg, index))
    return tuple((backend, tuple(sorted(policy_formats(policy, tensors, cfg.num_hidden_layers, backend))))
                 for backend in ("numpy", "max"))


class _Sizes:
    """Stored bytes: by the policy's formats, or at one dtype for every tensor without one."""

    def __init__(self, cfg: DeepseekV2Config, policy: str | None, dtype_bytes: int) -> None:
        self.cfg, self.policy, self.dtype_bytes = cfg, policy, dtype_bytes
        self.norm_bytes = 4 if policy is not None else dtype_bytes
        kv_bytes = KV_DTYPE_BYTES if policy is not None else dtype_bytes
        self.kv_format = KvFormat(kv_bytes, kv_bytes)

    def matrix(self, name: str, rows: int, cols: int) -> int:
        if self.policy is None:
            return rows * cols * self.dtype_bytes
        return matrix_bytes(self.policy, name, rows, cols, self.cfg.num_hidden_layers)

    def layer(self, index: int) -> LayerBytes:
        if self.policy is not None:
            return layer_bytes(self.cfg, index, self.policy)
        shapes = layer_tensors(self.cfg, index)
        total = sum(math.prod(s) for s in shapes.values()) * self.dtype_bytes
        routed = sum(math.prod(s) for n, s in shapes.items() if ".mlp.experts." in n) * self.dtype_bytes
        experts = self.cfg.n_routed_experts if self.cfg.is_moe_layer(index) else 0
        return LayerBytes(total, routed, routed // experts if experts else 0)


def weight_dtype_of(raw: dict[str, Any]) -> DType:
    name = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    dtype = _TORCH_DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        raise ConfigError(f"checkpoint dtype {name!r} is not supported (bfloat16, float16, float32)")
    return dtype


def _attention_params(cfg: DeepseekV2Config) -> int:
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    if cfg.q_lora_rank is None:
        q = heads * cfg.qk_head_dim * h
    else:
        q = cfg.q_lora_rank * h + cfg.q_lora_rank + heads * cfg.qk_head_dim * cfg.q_lora_rank
    kv_a = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * h + cfg.kv_lora_rank
    kv_b = heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * cfg.kv_lora_rank
    out = h * heads * cfg.v_head_dim
    return q + kv_a + kv_b + out


def _layer_cost(cfg: DeepseekV2Config, index: int, sizes: _Sizes) -> LayerCost:
    h = cfg.hidden_size
    stored = sizes.layer(index)
    norms = 2 * h
    attention = _attention_params(cfg)
    if cfg.is_moe_layer(index):
        expert = 3 * h * cfg.moe_intermediate_size
        shared = 3 * h * cfg.moe_intermediate_size * cfg.n_shared_experts
        router = cfg.n_routed_experts * h
        dense = norms + attention + router + shared
        active = dense + cfg.num_experts_per_tok * expert
        widest = max(cfg.moe_intermediate_size * max(cfg.num_experts_per_tok + cfg.n_shared_experts, 1), h)
    else:
        dense = active = norms + attention + 3 * h * cfg.intermediate_size
        widest = max(cfg.intermediate_size, h)
    heads = cfg.num_attention_heads
    widest = max(widest, heads * (cfg.qk_head_dim + cfg.v_head_dim))
    return LayerCost(
        index=index,
        is_moe=cfg.is_moe_layer(index),
        weight_bytes=stored.total,
        dense_weight_bytes=stored.total - stored.routed,
        flops_per_token=2 * active,
        attention_flops_per_context_token=2 * heads * (cfg.qk_head_dim + cfg.v_head_dim),
        kv_bytes_per_token=sizes.kv_format.row_bytes(cfg.kv_lora_rank, cfg.qk_rope_head_dim),
        scratch_bytes_per_row=4 * widest,
        kv_scale_bytes_per_block=sizes.kv_format.scale_bytes_per_block,
    )
