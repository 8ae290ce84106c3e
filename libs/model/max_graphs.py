"""MAX graph builders for DeepSeek-V2 stage execution, one graph per layer kind.

Every graph has symbolic row (`R`) and past (`P`) dims, so one compile serves every batch
shape. Layer weights are graph `Weight`s with layer-independent names; the same compiled graph
is bound to each layer's tensors through a weights registry (see `max_kernels`). The causal /
cross-sequence mask is a graph input built on the host, never derived in the graph.

Each layer graph holds both forms of MLA attention (see `mla_forms`) behind one runtime branch
(`ops.cond` on a host boolean input): the expanded form scores the microbatch's keys expanded per
head under the dense [R, P + R] mask; the absorbed form scores each row's own keys, gathered by
the host-built [R, K] key index, in the latent space. One compile serves both forms.

Linear weights are bound transposed to [in, out] (`LINEAR_WEIGHTS`); the shape tables below
give the Hugging Face [out, in] shapes that the registry is checked against. MoE layers are split in two: the layer
graph runs attention, the router (softmax, top-k, scaling) and the shared experts; the routed
experts then run in one launch of the routed-experts graph, bound per layer (`max_runtime`
groups the rows by expert on the host and passes each expert's rows and routing weights; each
expert gathers its rows, runs, and scatter-adds its weighted output, and an expert without rows
is skipped). On CPU this does the routed work only, instead of every expert on every row, and
pays one launch per layer instead of one per expert. Expert weights are transposed per layer at
load time, so no transposes run per call.

A linear weight held in a GGUF block format (`GraphSpec.quant`) is bound as uint8 [out, row
bytes] and its product runs in-graph. Q4_0, Q4_K and Q6_K go through MAX's packed product kernel,
the second half of `ops.qmatmul` (int8 activations per 32-block, VNNI on x86), when the stage's
`activations` are "int8" and the output dim is a multiple of `MAX_QMATMUL_OUT_MULTIPLE`: their
stored bytes are repacked once at bind time by MAX's own repack kernel (`max_repack`; a repack
left in the graph would run on every call where it sits in an `ops.cond` branch). Every other
block-format product (Q8_0, Q5_0, Q5_1 always; all six with "float32" activations) runs the Mojo
custom op of `libs.model.custom_kernels` on the stored GGUF bytes, float32 activations against
each block decoded to float32, from the package `GraphSpec.kernel_package` names. Each distinct
set of formats is its own graph (and compile). The routed experts' formats are named `experts_gate_up` and
`experts_down` for every expert of the layer.

A graph with block-format products computes in float32 around its float weights
(`GraphSpec.float32_math`), as the reference does: the norms and the router are declared and
bound float32, and a weight stored bf16 (a quantized stage holds its embeddings and kv_b in bf16)
is widened in-graph for its product, so no activation is rounded to bf16. A graph of bf16 weights
alone (the bf16 policy) rounds its products' inputs to bf16 and runs them in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, TensorType, TensorValue, Weight, ops
from max.graph.quantization import QuantizationEncoding

from libs.model.config import DeepseekV2Config
from libs.model.custom_kernels import needs_custom_op, op_name
from libs.model.errors import MojoKernelsError
from libs.weights.formats import weight_format
from libs.weights.policy import MAX_QMATMUL_OUT_MULTIPLE

ROWS = "R"
PAST = "P"
KEYS = "T"  # = P + R; checked at run time by a rebind
ROW_KEYS = "K"  # the absorbed form's per-row key width
EXPERT_ROWS = "N"


# Linear weights: the registry holds them transposed to [in, out] (see `_Builder.linear`).
# kv_b_proj is bound split instead, per head for the absorbed form: `kv_b_k` [heads, nope, rank]
# and `kv_b_v` [heads, rank, v]; and as [in, out] halves for the expanded form: `kv_b_k_expand`
# [rank, heads * nope] and `kv_b_v_expand` [rank, heads * v] (see `_attention`).
LINEAR_WEIGHTS = frozenset({
    "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj",
    "gate_proj", "up_proj", "down_proj", "shared_gate_proj", "shared_up_proj", "shared_down_proj",
    "router", "lm_head",
})


class GraphKind(Enum):
    EMBED = "embed"
    DENSE_LAYER = "dense_layer"
    MOE_LAYER = "moe_layer"
    FINAL = "final"
    EXPERT = "expert"


@dataclass(frozen=True)
class GraphSpec:
    """What a graph is built from; equal specs build identical graphs (and cache keys)."""

    kind: GraphKind
    cfg: DeepseekV2Config
    weight_dtype: DType
    device: DeviceRef
    # (linear weight name, block format) for each block-format linear weight, sorted
    quant: tuple[tuple[str, str], ...] = ()
    # Activations of block-format products: "int8" (ops.qmatmul where it has the format) or
    # "float32" (the Mojo custom op for every block format)
    activations: str = "int8"
    # The built Mojo custom-op package (`custom_kernels.gguf_matmul_package`); "" when no
    # product of this graph runs a custom op
    kernel_package: str = ""

    def quant_format(self, name: str) -> str | None:
        return dict(self.quant).get(name)

    @property
    def float32_math(self) -> bool:
        """Whether the graph computes in float32 around bf16-stored weights: one with block-format
        products does (see `full_precision`), a graph of bf16 weights alone (the bf16 policy) runs
        its products in bf16."""
        return bool(self.quant)

    def runs_custom_op(self, fmt: str, out_dim: int) -> bool:
        return runs_custom_op(fmt, out_dim, self.activations)

    def custom_extensions(self) -> list[Path]:
        return [Path(self.kernel_package)] if self.kernel_package else []


QMATMUL_ENCODINGS = {"q4_0": QuantizationEncoding.Q4_0, "q4_k": QuantizationEncoding.Q4_K,
                     "q6_k": QuantizationEncoding.Q6_K}
# MAX's product kernel of each, on weights in its own layout (`max_repack` lays them out at bind).
PACKED_MATMUL_OPS = {"q4_0": "vroom_q4_0_matmul", "q4_k": "vroom_q4_k_matmul", "q6_k": "vroom_q6_k_matmul"}


def full_precision(name: str, rank: int) -> bool:
    """Whether a graph weight is one `_Builder.weight` reads at full precision (the norms, rank 1,
    and the router): a `float32_math` graph declares it float32, and it is bound unrounded."""
    return rank == 1 or name == "router"


def runs_custom_op(fmt: str, out_dim: int, activations: str) -> bool:
    """Whether a block-format product of `out_dim` outputs runs the Mojo custom op (else MAX's
    packed product on a repacked weight)."""
    return needs_custom_op(fmt, activations) or out_dim % MAX_QMATMUL_OUT_MULTIPLE != 0


def quant_row_bytes(fmt: str, row: int) -> int:
    return weight_format(fmt).row_bytes(row)


class _Builder:
    """Adds layer-independent weights to the graph being built."""

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec
        self.cfg = spec.cfg

    def weight(self, name: str, shape: list[int]) -> TensorValue:
        """A full-precision weight (a norm, the router) in float32: declared float32 in a
        `float32_math` graph, else stored in the graph's dtype and cast in-graph."""
        if self.spec.float32_math:
            w = Weight(name, DType.float32, shape, self.spec.device)
            return Graph.current.add_weight(w, force_initial_weight_on_host=self.spec.device.is_cpu())
        value = self.stored_weight(name, shape)
        return value if value.dtype == DType.float32 else ops.cast(value, DType.float32)

    def stored_weight(self, name: str, shape: list[int]) -> TensorValue:
        w = Weight(name, self.spec.weight_dtype, shape, self.spec.device)
        return Graph.current.add_weight(w, force_initial_weight_on_host=self.spec.device.is_cpu())

    def matmul(self, x: TensorValue, w: TensorValue) -> TensorValue:
        """float32 `x` (or `x` already in the weight's dtype) @ stored weight; with bf16 weights
        the product runs in bf16 and comes back as float32, or, in a `float32_math` graph, the
        weight is widened in-graph and the product runs in float32 (activations never rounded)."""
        if w.dtype == DType.float32:
            return ops.matmul(x, w)
        if self.spec.float32_math:
            return ops.matmul(x if x.dtype == DType.float32 else ops.cast(x, DType.float32),
                              ops.cast(w, DType.float32))
        if x.dtype != w.dtype:
            x = ops.cast(x, w.dtype)
        return ops.cast(ops.matmul(x, w), DType.float32)

    def in_weight_dtype(self, x: TensorValue) -> TensorValue:
        """`x` cast to the stored weights' dtype (a no-op for float32 weights and in a
        `float32_math` graph)."""
        if self.spec.float32_math or self.spec.weight_dtype == x.dtype:
            return x
        return ops.cast(x, self.spec.weight_dtype)

    def linear(self, x: TensorValue, name: str, out_dim: int, in_dim: int) -> TensorValue:
        # Stored [in, out] (transposed once at load): an in-graph transpose of an [out, in]
        # weight is materialised on every call on CPU, which dominates small-batch decode.
        fmt = self.spec.quant_format(name)
        if fmt is not None:
            return self.qlinear(x, self.quant_weight(name, fmt, out_dim, in_dim), fmt)
        return self.matmul(x, self.stored_weight(name, [in_dim, out_dim]))

    def quant_weight(self, name: str, fmt: str, out_dim: int, in_dim: int) -> TensorValue:
        """A block-format weight, uint8 [out, row bytes] (not transposed): bound already in MAX's
        product layout (`max_repack`) where the packed product runs it, else as its GGUF bytes."""
        w = Weight(name, DType.uint8, [out_dim, quant_row_bytes(fmt, in_dim)], self.spec.device)
        return Graph.current.add_weight(w, force_initial_weight_on_host=self.spec.device.is_cpu())

    def qlinear(self, x: TensorValue, w: TensorValue, fmt: str) -> TensorValue:
        """float32 `x` [rows, in] @ a block-format weight, in-graph, float32 out [rows, out]."""
        if x.dtype != DType.float32:
            x = ops.cast(x, DType.float32)
        out_dim = int(w.shape[0])
        out = TensorType(DType.float32, [x.shape[0], out_dim], self.spec.device)
        if not self.spec.runs_custom_op(fmt, out_dim):
            return ops.custom(PACKED_MATMUL_OPS[fmt], self.spec.device, [x, w], out_types=[out])[0].tensor
        if not self.spec.kernel_package:
            raise MojoKernelsError(f"graph spec runs {fmt} through the Mojo custom op but names no kernel package")
        return ops.custom(op_name(fmt), self.spec.device, [x, w], [out])[0].tensor

    def rms_norm(self, x: TensorValue, name: str, dim: int) -> TensorValue:
        return ops.rms_norm(x, self.weight(name, [dim]), self.cfg.rms_norm_eps)


def attention_weight_shapes(cfg: DeepseekV2Config) -> dict[str, tuple[int, ...]]:
    """Graph weight name -> shape for the attention block (shared by both layer kinds)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {"input_layernorm": (h,)}
    if cfg.q_lora_rank is None:
        shapes["q_proj"] = (heads * cfg.qk_head_dim, h)
    else:
        shapes["q_a_proj"] = (cfg.q_lora_rank, h)
        shapes["q_a_layernorm"] = (cfg.q_lora_rank,)
        shapes["q_b_proj"] = (heads * cfg.qk_head_dim, cfg.q_lora_rank)
    shapes["kv_a_proj_with_mqa"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h)
    shapes["kv_a_layernorm"] = (cfg.kv_lora_rank,)
    shapes["kv_b_proj"] = (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes["o_proj"] = (h, heads * cfg.v_head_dim)
    shapes["post_attention_layernorm"] = (h,)
    return shapes


def mlp_weight_shapes(cfg: DeepseekV2Config, moe: bool) -> dict[str, tuple[int, ...]]:
    h = cfg.hidden_size
    if not moe:
        i = cfg.intermediate_size
        return {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
    e, i = cfg.n_routed_experts, cfg.moe_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "router": (e, h),
    }
    if cfg.n_shared_experts:
        si = i * cfg.n_shared_experts
        shapes.update({"shared_gate_proj": (si, h), "shared_up_proj": (si, h), "shared_down_proj": (h, si)})
    return shapes


def build_graph(spec: GraphSpec) -> Graph:
    builders = {
        GraphKind.EMBED: _build_embed,
        GraphKind.DENSE_LAYER: _build_layer,
        GraphKind.MOE_LAYER: _build_layer,
        GraphKind.FINAL: _build_final,
        GraphKind.EXPERT: _build_expert,
    }
    return builders[spec.kind](spec)


def _build_embed(spec: GraphSpec) -> Graph:
    cfg = spec.cfg
    ids_type = TensorType(DType.int32, [ROWS], device=spec.device)
    with Graph("fornax_embed", input_types=[ids_type]) as graph:
        table = _Builder(spec).stored_weight("embed_tokens", [cfg.vocab_size, cfg.hidden_size])
        graph.output(ops.cast(ops.gather(table, graph.inputs[0].tensor, axis=0), DType.float32))
    return graph


def _build_final(spec: GraphSpec) -> Graph:
    cfg = spec.cfg
    hidden_type = TensorType(DType.float32, [ROWS, cfg.hidden_size], device=spec.device)
    with Graph("fornax_final", input_types=[hidden_type], custom_extensions=spec.custom_extensions()) as graph:
        b = _Builder(spec)
        x = b.rms_norm(graph.inputs[0].tensor, "norm", cfg.hidden_size)
        graph.output(b.linear(x, "lm_head", cfg.vocab_size, cfg.hidden_size))
    return graph


def layer_input_types(cfg: DeepseekV2Config, device: DeviceRef) -> list[TensorType]:
    """hidden, cos, sin, past latent, past k_rope, dense mask [R, P + R], per-row key index and
    mask [R, K] (absorbed form), and the form switch (bool scalar on the host: True = expanded)."""
    half_rope = cfg.qk_rope_head_dim // 2
    f32 = DType.float32
    return [
        TensorType(f32, [ROWS, cfg.hidden_size], device=device),
        TensorType(f32, [ROWS, half_rope], device=device),
        TensorType(f32, [ROWS, half_rope], device=device),
        TensorType(f32, [PAST, cfg.kv_lora_rank], device=device),
        TensorType(f32, [PAST, cfg.qk_rope_head_dim], device=device),
        TensorType(f32, [ROWS, KEYS], device=device),
        TensorType(DType.int32, [ROWS, ROW_KEYS], device=device),
        TensorType(f32, [ROWS, ROW_KEYS], device=device),
        TensorType(DType.bool, [], device=DeviceRef.CPU()),
    ]


def _build_layer(spec: GraphSpec) -> Graph:
    cfg = spec.cfg
    name = f"fornax_{spec.kind.value}"
    with Graph(name, input_types=layer_input_types(cfg, spec.device),
               custom_extensions=spec.custom_extensions()) as graph:
        hidden, cos, sin, past_latent, past_k_rope, mask, key_index, key_mask, expanded = (
            v.tensor for v in graph.inputs)
        b = _Builder(spec)
        attn_out, latent, k_rope = _attention(
            b, hidden, cos, sin, past_latent, past_k_rope, _KeySets(mask, key_index, key_mask, expanded))
        hidden = hidden + attn_out
        x = b.rms_norm(hidden, "post_attention_layernorm", cfg.hidden_size)
        if spec.kind is GraphKind.MOE_LAYER:
            ids, weights = _route(b, x)
            if cfg.n_shared_experts:
                hidden = hidden + _swiglu(b, x, "shared_", cfg.moe_intermediate_size * cfg.n_shared_experts)
            graph.output(hidden, latent, k_rope, ids, x, weights)
        else:
            mlp_out = _swiglu(b, x, "", cfg.intermediate_size)
            graph.output(hidden + mlp_out, latent, k_rope)
    return graph


@dataclass(frozen=True)
class _KeySets:
    mask: TensorValue       # [R, P + R] additive, expanded form
    key_index: TensorValue  # [R, K] int32 into [past ; new], absorbed form
    key_mask: TensorValue   # [R, K] additive, absorbed form
    expanded: TensorValue   # bool scalar on the host


def _rope(x: TensorValue, cos: TensorValue, sin: TensorValue) -> TensorValue:
    """Rotates interleaved (even, odd) pairs of the last dim, as transformers' complex form.

    `x` is [R, heads, rope_dim]; `cos`/`sin` are [R, rope_dim // 2] (scaling included).
    """
    rows, heads, dim = x.shape
    pairs = ops.reshape(x, [rows, heads, dim // 2, 2])
    even = ops.squeeze(pairs[:, :, :, 0:1], -1)
    odd = ops.squeeze(pairs[:, :, :, 1:2], -1)
    c = ops.unsqueeze(cos, 1)
    s = ops.unsqueeze(sin, 1)
    rotated = ops.stack([even * c - odd * s, even * s + odd * c], axis=-1)
    return ops.reshape(rotated, [rows, heads, dim])


def _queries(b: _Builder, x: TensorValue) -> TensorValue:
    cfg = b.cfg
    out_dim = cfg.num_attention_heads * cfg.qk_head_dim
    if cfg.q_lora_rank is None:
        return b.linear(x, "q_proj", out_dim, cfg.hidden_size)
    q_a = b.linear(x, "q_a_proj", cfg.q_lora_rank, cfg.hidden_size)
    q_a = b.rms_norm(q_a, "q_a_layernorm", cfg.q_lora_rank)
    return b.linear(q_a, "q_b_proj", out_dim, cfg.q_lora_rank)


def _attention(b, hidden, cos, sin, past_latent, past_k_rope, key_sets):  # noqa: ANN001, ANN202
    """MLA attention over keys [past ; new] in the form `key_sets.expanded` picks; returns
    (o_proj output, new latent, new k_rope)."""
    cfg = b.cfg
    heads, nope, v_dim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    rows = hidden.shape[0]
    x = b.rms_norm(hidden, "input_layernorm", cfg.hidden_size)
    q = ops.reshape(_queries(b, x), [rows, heads, cfg.qk_head_dim])
    q_nope = q[:, :, :nope]
    q_rope = _rope(q[:, :, nope:], cos, sin)
    latent, k_rope = _new_latent(b, x, cos, sin, rows)
    all_latent = ops.concat([past_latent, latent], axis=0)
    all_k_rope = ops.concat([past_k_rope, k_rope], axis=0)
    w = _kv_b_weights(b)
    # The expanded form's input in the weights' dtype, cast outside the branch: a bf16 cast of
    # the [T, rank] keys inside a branch fails MAX 26.7's shape check on the cast.
    expand_in = b.in_weight_dtype(all_latent)
    q_nope_h = ops.permute(q_nope, [1, 0, 2])  # [heads, R, nope]
    q_rope_h = ops.permute(q_rope, [1, 0, 2])  # [heads, R, rope]
    scale = cfg.softmax_scale()

    def expanded() -> TensorValue:
        keys = all_latent.shape[0]
        k_nope = ops.reshape(b.matmul(expand_in, w["kv_b_k_expand"]), [keys, heads, nope])
        values = ops.reshape(b.matmul(expand_in, w["kv_b_v_expand"]), [keys, heads, v_dim])
        scores = ops.matmul(q_nope_h, ops.permute(k_nope, [1, 2, 0]))  # [heads, R, keys]
        scores = scores + ops.matmul(q_rope_h, ops.transpose(all_k_rope, 0, 1))
        mask = ops.rebind(key_sets.mask, [rows, keys], message="mask must be [R, P + R]")
        probs = ops.softmax(scores * scale + ops.unsqueeze(mask, 0), axis=-1)
        context = ops.matmul(probs, ops.permute(values, [1, 0, 2]))  # [heads, R, v]
        return ops.reshape(ops.permute(context, [1, 0, 2]), [rows, heads * v_dim])

    def absorbed() -> TensorValue:
        # kv_b's key half folded into q and its value half into the output; each row attends
        # over its own gathered keys only.
        q_latent = ops.permute(b.matmul(q_nope_h, w["kv_b_k"]), [1, 0, 2])  # [R, heads, rank]
        row_latent = ops.gather(all_latent, key_sets.key_index, axis=0)  # [R, K, rank]
        row_k_rope = ops.gather(all_k_rope, key_sets.key_index, axis=0)  # [R, K, rope]
        scores = ops.matmul(q_latent, ops.transpose(row_latent, 1, 2))  # [R, heads, K]
        scores = scores + ops.matmul(q_rope, ops.transpose(row_k_rope, 1, 2))
        probs = ops.softmax(scores * scale + ops.unsqueeze(key_sets.key_mask, 1), axis=-1)
        context = ops.permute(ops.matmul(probs, row_latent), [1, 0, 2])  # [heads, R, rank]
        context = b.matmul(context, w["kv_b_v"])  # [heads, R, v]
        return ops.reshape(ops.permute(context, [1, 0, 2]), [rows, heads * v_dim])

    out_type = TensorType(DType.float32, [rows, heads * v_dim], device=b.spec.device)
    (context,) = ops.cond(key_sets.expanded, [out_type], expanded, absorbed)
    out = b.linear(context, "o_proj", cfg.hidden_size, heads * v_dim)
    return out, latent, k_rope


def _new_latent(b: _Builder, x: TensorValue, cos: TensorValue, sin: TensorValue,
                rows: Dim) -> tuple[TensorValue, TensorValue]:
    """The new rows' compressed KV: (normed latent [R, rank], rotated k_rope [R, rope])."""
    cfg = b.cfg
    rank, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    compressed = b.linear(x, "kv_a_proj_with_mqa", rank + rope, cfg.hidden_size)
    latent = b.rms_norm(compressed[:, :rank], "kv_a_layernorm", rank)
    k_rope = ops.reshape(_rope(ops.reshape(compressed[:, rank:], [rows, 1, rope]), cos, sin), [rows, rope])
    return latent, k_rope


def _kv_b_weights(b: _Builder) -> dict[str, TensorValue]:
    """kv_b in both attention forms' layouts. Weights are added to the graph outside the
    branches, which only read them."""
    cfg = b.cfg
    heads, nope, rank, v_dim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
    return {
        "kv_b_k": b.stored_weight("kv_b_k", [heads, nope, rank]),
        "kv_b_v": b.stored_weight("kv_b_v", [heads, rank, v_dim]),
        "kv_b_k_expand": b.stored_weight("kv_b_k_expand", [rank, heads * nope]),
        "kv_b_v_expand": b.stored_weight("kv_b_v_expand", [rank, heads * v_dim]),
    }


def _swiglu(b: _Builder, x: TensorValue, prefix: str, inter: int) -> TensorValue:
    h = b.cfg.hidden_size
    gate = b.linear(x, f"{prefix}gate_proj", inter, h)
    up = b.linear(x, f"{prefix}up_proj", inter, h)
    return b.linear(ops.silu(gate) * up, f"{prefix}down_proj", h, inter)


def _route(b: _Builder, x: TensorValue) -> tuple[TensorValue, TensorValue]:
    """Softmax router and top-k: (expert ids int32 [R, k] best first, weights f32 [R, k])."""
    cfg = b.cfg
    e, h = cfg.n_routed_experts, cfg.hidden_size
    # The router stays float32 whatever the weight storage, as in the reference models.
    scores = ops.softmax(ops.matmul(x, b.weight("router", [h, e])), axis=-1)
    weights, ids = ops.top_k(_group_limited(cfg, scores), cfg.num_experts_per_tok, axis=-1)
    if cfg.norm_topk_prob and cfg.num_experts_per_tok > 1:
        weights = weights / (ops.sum(weights, axis=-1) + 1e-20)
    else:  # DeepSeek-V2 scales only un-normalised routing weights
        weights = weights * cfg.routed_scaling_factor
    return ops.cast(ids, DType.int32), weights


def expert_input_types(spec: GraphSpec) -> list[TensorType]:
    """hidden and x [R, hidden]; per expert e: its rows `rows_e` int32 [N_e] and routing weights
    `weights_e` f32 [N_e]; then one host bool per expert (False: no rows, its inputs are
    placeholders and its work is skipped)."""
    cfg, device = spec.cfg, spec.device
    h = cfg.hidden_size
    types = [TensorType(DType.float32, [ROWS, h], device=device), TensorType(DType.float32, [ROWS, h], device=device)]
    for e in range(cfg.n_routed_experts):
        types += [TensorType(DType.int32, [f"{EXPERT_ROWS}{e}"], device=device),
                  TensorType(DType.float32, [f"{EXPERT_ROWS}{e}"], device=device)]
    types += [TensorType(DType.bool, [], device=DeviceRef.CPU()) for _ in range(cfg.n_routed_experts)]
    return types


def expert_weight_names(e: int) -> tuple[str, str]:
    return f"experts_gate_up_{e}", f"experts_down_{e}"


def _build_expert(spec: GraphSpec) -> Graph:
    """Every routed expert of one MoE layer in one launch: each expert with rows gathers them,
    runs its SwiGLU and scatter-adds the weighted result into `hidden`; an expert without rows
    is skipped by its host switch. Weights are bound per layer: `experts_gate_up_{e}`
    [hidden, 2*moe_inter] and `experts_down_{e}` [moe_inter, hidden], laid out at load time."""
    cfg = spec.cfg
    h, inter, experts = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    with Graph("fornax_routed_experts", input_types=expert_input_types(spec),
               custom_extensions=spec.custom_extensions()) as graph:
        values = [v.tensor for v in graph.inputs]
        hidden, x = values[0], values[1]
        flags = values[2 + 2 * experts:]
        b = _Builder(spec)
        out_type = TensorType(DType.float32, [ROWS, h], device=spec.device)
        gate_up_fmt, down_fmt = spec.quant_format("experts_gate_up"), spec.quant_format("experts_down")
        for e in range(experts):
            rows, weights = values[2 + 2 * e], values[3 + 2 * e]
            gate_up_name, down_name = expert_weight_names(e)
            gate_up_w = (b.quant_weight(gate_up_name, gate_up_fmt, 2 * inter, h) if gate_up_fmt
                         else b.stored_weight(gate_up_name, [h, 2 * inter]))
            down_w = (b.quant_weight(down_name, down_fmt, h, inter) if down_fmt
                      else b.stored_weight(down_name, [inter, h]))

            def product(x_rows, w, fmt):  # noqa: ANN001, ANN202
                return b.qlinear(x_rows, w, fmt) if fmt else b.matmul(x_rows, w)

            def run_expert(acc=hidden, rows=rows, weights=weights, gate_up_w=gate_up_w, down_w=down_w):  # noqa: ANN001, ANN202
                gate_up = product(ops.gather(x, rows, axis=0), gate_up_w, gate_up_fmt)
                y = product(ops.silu(gate_up[:, :inter]) * gate_up[:, inter:], down_w, down_fmt)
                return ops.scatter_nd_add(acc, y * ops.unsqueeze(weights, 1), ops.unsqueeze(rows, 1))

            def skip(acc=hidden):  # noqa: ANN001, ANN202
                return acc

            (hidden,) = ops.cond(flags[e], [out_type], run_expert, skip)
        graph.output(hidden)
    return graph


def _group_limited(cfg: DeepseekV2Config, scores: TensorValue) -> TensorValue:
    """Zeroes experts outside the `topk_group` best groups (group score = max member score)."""
    if cfg.topk_method != "group_limited_greedy":
        return scores
    rows = scores.shape[0]
    groups, topk_group = cfg.routing_groups
    per_group = cfg.n_routed_experts // groups
    grouped = ops.reshape(scores, [rows, groups, per_group])
    group_scores = ops.reshape(ops.max(grouped, axis=-1), [rows, groups])
    best, _ = ops.top_k(group_scores, topk_group, axis=-1)
    threshold = best[:, topk_group - 1 : topk_group]  # [R, 1]
    keep = ops.cast(ops.unsqueeze(group_scores >= threshold, -1), DType.float32)  # [R, G, 1]
    kept = grouped * keep
    return ops.reshape(kept, [rows, cfg.n_routed_experts])
