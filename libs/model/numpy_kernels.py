"""Numpy reference implementation of the stage kernel protocol.

Float32 math throughout. A weight held in a compact format (bf16, a GGUF block format) is
decoded from its stored bytes for the product that uses it and dropped after it, so the
reference defines the math of a quantized model and never keeps a float32 copy of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.kernels import LayerInputs, LayerOutputs
from libs.model.rope import apply_rope
from libs.model.weights import AttentionWeights, MoeWeights, StageWeights, SwiGluWeights
from libs.weights.tensor import Weight, dense, rows_of

# Hugging Face builds q_a_layernorm and kv_a_layernorm with the RMSNorm default epsilon,
# not config.rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (weight * (x / np.sqrt(variance + np.float32(eps)))).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    # tanh form: no overflow for large negative inputs
    return (x * (np.float32(0.5) * (1 + np.tanh(np.float32(0.5) * x)))).astype(np.float32)


def linear(x: np.ndarray, w: Weight) -> np.ndarray:
    """x @ wᵀ for an [out, in] weight in any stored format."""
    return x @ dense(w).T


def swiglu(x: np.ndarray, w: SwiGluWeights) -> np.ndarray:
    return linear(silu(linear(x, w.gate)) * linear(x, w.up), w.down)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def top_k_desc(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, best first (ties: lower index first)."""
    part = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(part, order, axis=-1)


@dataclass(frozen=True)
class Routing:
    expert_ids: np.ndarray  # int32 [R, k], best first
    weights: np.ndarray     # float32 [R, k]


def route(cfg: DeepseekV2Config, x: np.ndarray, router: Weight) -> Routing:
    scores = softmax(linear(x, router))
    k = cfg.num_experts_per_tok
    choice = scores
    if cfg.topk_method == "group_limited_greedy":
        rows, (groups, topk_group) = scores.shape[0], cfg.routing_groups
        group_scores = scores.reshape(rows, groups, -1).max(axis=-1)
        best_groups = top_k_desc(group_scores, topk_group)
        keep = np.zeros_like(group_scores, dtype=bool)
        np.put_along_axis(keep, best_groups, True, axis=-1)
        choice = np.where(np.repeat(keep, cfg.n_routed_experts // groups, axis=-1), scores, 0.0)
    ids = top_k_desc(choice, k)
    weights = np.take_along_axis(choice, ids, axis=-1).astype(np.float32)
    if k > 1 and cfg.norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + np.float32(1e-20))
    else:
        weights = weights * np.float32(cfg.routed_scaling_factor)
    return Routing(ids.astype(np.int32), weights.astype(np.float32))


def moe(cfg: DeepseekV2Config, x: np.ndarray, w: MoeWeights) -> tuple[np.ndarray, np.ndarray]:
    routing = route(cfg, x, w.router)
    out = np.zeros_like(x)
    flat_experts = routing.expert_ids.reshape(-1)
    flat_rows = np.repeat(np.arange(x.shape[0]), routing.expert_ids.shape[1])
    flat_weights = routing.weights.reshape(-1)
    order = np.argsort(flat_experts, kind="stable")
    bounds = np.searchsorted(flat_experts[order], np.arange(cfg.n_routed_experts + 1))
    for e in map(int, np.flatnonzero(np.diff(bounds))):
        picked = order[bounds[e] : bounds[e + 1]]
        rows = flat_rows[picked]  # unique within one expert: top-k ids are distinct
        xe = x[rows]
        he = linear(silu(linear(xe, w.experts_gate[e])) * linear(xe, w.experts_up[e]), w.experts_down[e])
        out[rows] += he * flat_weights[picked][:, None]
    if w.shared is not None:
        out = out + swiglu(x, w.shared)
    return out.astype(np.float32), routing.expert_ids


def mla_attention(cfg: DeepseekV2Config, x: np.ndarray, w: AttentionWeights, inp: LayerInputs):
    rows, heads = x.shape[0], cfg.num_attention_heads
    nope, rope_dim, v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if w.q_proj is not None:
        q = linear(x, w.q_proj)
    else:
        q_a_proj, q_a_norm, q_b_proj = w.query_lora()
        q = linear(rms_norm(linear(x, q_a_proj), q_a_norm, LATENT_NORM_EPS), q_b_proj)
    q = q.reshape(rows, heads, nope + rope_dim)
    q_nope, q_pe = q[..., :nope], apply_rope(q[..., nope:], inp.rope_cos, inp.rope_sin)
    compressed = linear(x, w.kv_a_proj)
    latent = rms_norm(compressed[:, : cfg.kv_lora_rank], w.kv_a_norm, LATENT_NORM_EPS)
    k_pe = apply_rope(compressed[:, cfg.kv_lora_rank :], inp.rope_cos, inp.rope_sin)
    all_latent = np.concatenate([inp.past_latent, latent], axis=0)   # [T, C]
    all_k_pe = np.concatenate([inp.past_k_rope, k_pe], axis=0)       # [T, rope]
    kv_b = dense(w.kv_b_proj).reshape(heads, nope + v_dim, cfg.kv_lora_rank)
    q_pe_scores = np.matmul(q_pe.transpose(1, 0, 2), all_k_pe.T)               # [H, R, T]
    if absorbed_attention_is_cheaper(cfg, rows):
        # Absorbed form: fold kv_b_proj into the query and the output instead of expanding
        # every cached latent into per-head keys and values (far less work for decode).
        q_latent = np.matmul(q_nope.transpose(1, 0, 2), kv_b[:, :nope, :])    # [H, R, C]
        scores = np.matmul(q_latent, all_latent.T) + q_pe_scores
        probs = softmax(scores * np.float32(cfg.softmax_scale()) + inp.mask[None, :, :])  # [H, R, T]
        context = np.matmul(probs, all_latent)                                  # [H, R, C]
        attended = np.matmul(context, kv_b[:, nope:, :].transpose(0, 2, 1))     # [H, R, v]
    else:
        # Expanded form: every key's per-head key and value once (cheaper for many rows).
        k_nope = np.matmul(all_latent, kv_b[:, :nope, :].transpose(0, 2, 1))  # [H, T, nope]
        values = np.matmul(all_latent, kv_b[:, nope:, :].transpose(0, 2, 1))  # [H, T, v]
        scores = np.matmul(q_nope.transpose(1, 0, 2), k_nope.transpose(0, 2, 1)) + q_pe_scores
        probs = softmax(scores * np.float32(cfg.softmax_scale()) + inp.mask[None, :, :])  # [H, R, T]
        attended = np.matmul(probs, values)                                     # [H, R, v]
    attended = attended.transpose(1, 0, 2).reshape(rows, heads * v_dim)
    return linear(attended, w.o_proj), latent, k_pe


def absorbed_attention_is_cheaper(cfg: DeepseekV2Config, rows: int) -> bool:
    """Which MLA form takes fewer multiply-adds for `rows` query rows over T keys (the same
    math either way). Per key and head, absorbed: rows * (2 * C + rope) (latent scores and
    latent context); expanded: C * (nope + v) to expand the key once, plus rows * (nope + rope
    + v). Decode (a few rows) stays absorbed; a prefill of more rows than
    C * (nope + v) / (2 * C - nope - v) (85 on `small`, 170 on V2-Lite's shapes) expands."""
    rank, nope, rope, v_dim = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    absorbed = rows * (2 * rank + rope)
    expanded = rank * (nope + v_dim) + rows * (nope + rope + v_dim)
    return absorbed <= expanded


class NumpyKernels:
    """Reference backend; weights stay in their stored format in host memory."""

    name = "numpy"

    def __init__(self, cfg: DeepseekV2Config, weights: StageWeights) -> None:
        self.cfg = cfg
        self.weights = weights
        self.build = f"numpy {np.__version__}"

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        if self.weights.embed is None:
            raise ValueError("this stage does not own the embeddings")
        return np.ascontiguousarray(rows_of(self.weights.embed, token_ids.astype(np.int64)), dtype=np.float32)

    def decoder_layer(self, layer_index: int, inputs: LayerInputs) -> LayerOutputs:
        lw = self.weights.layer(layer_index)
        eps = self.cfg.rms_norm_eps
        attn, latent, k_pe = mla_attention(self.cfg, rms_norm(inputs.hidden, lw.input_norm, eps), lw.attention, inputs)
        hidden = inputs.hidden + attn
        normed = rms_norm(hidden, lw.post_attention_norm, eps)
        expert_ids = None
        if lw.moe is not None:
            mlp_out, expert_ids = moe(self.cfg, normed, lw.moe)
        else:
            mlp_out = swiglu(normed, lw.dense())
        hidden = (hidden + mlp_out).astype(np.float32)
        return LayerOutputs(np.ascontiguousarray(hidden), latent, k_pe, expert_ids)

    def final(self, hidden: np.ndarray) -> np.ndarray:
        if self.weights.final_norm is None or self.weights.lm_head is None:
            raise ValueError("this stage does not own the final norm and LM head")
        normed = rms_norm(hidden, self.weights.final_norm, self.cfg.rms_norm_eps)
        return np.ascontiguousarray(linear(normed, self.weights.lm_head), dtype=np.float32)


def make_numpy_kernels(cfg: DeepseekV2Config, weights: StageWeights, device: str = "cpu") -> NumpyKernels:
    if device != "cpu":
        from libs.model.errors import BackendUnavailableError

        raise BackendUnavailableError(f"the numpy backend runs on cpu only, not {device!r}")
    return NumpyKernels(cfg, weights)
