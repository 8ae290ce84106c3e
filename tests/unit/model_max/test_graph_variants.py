"""The graph variants a background compile makes for a weight policy are exactly the ones the
MAX stages bind when they load that policy's weights (no compile here: signatures only)."""

from __future__ import annotations

import pytest

pytest.importorskip("max")

from libs.model.compile_cache import GraphName  # noqa: E402
from libs.model.config import load_config  # noqa: E402
from libs.model.graph_variants import graph_variants  # noqa: E402
from libs.model.max_kernels import weight_dtype_for  # noqa: E402
from libs.model.max_runtime import expert_quant, layer_registry, quant_signature  # noqa: E402
from libs.model.weights import load_stage_weights  # noqa: E402


@pytest.mark.parametrize("policy", ["q4_k_m", "q8_0", "bf16"])
def test_background_variants_match_what_stages_bind(max_checkpoint, policy):
    cfg = load_config(max_checkpoint)
    weights = load_stage_weights(max_checkpoint, cfg, 0, cfg.num_hidden_layers, True, True,
                                 policy=policy, backend="max")
    variants = graph_variants(cfg, policy)
    assert variants.weight_dtype == weight_dtype_for(weights)
    bound: dict[GraphName, set] = {}
    for i in range(cfg.num_hidden_layers):
        kind = GraphName.MOE_LAYER if cfg.is_moe_layer(i) else GraphName.DENSE_LAYER
        bound.setdefault(kind, set()).add(quant_signature(layer_registry(cfg, i, weights.layer(i))))
        if cfg.is_moe_layer(i):
            bound.setdefault(GraphName.EXPERT, set()).add(expert_quant(weights.layer(i).routed()))
    for kind, quants in bound.items():
        assert quants == set(variants.quant[kind]), kind
    if policy == "q4_k_m":  # this preset's rows fit no 256-block: llama.cpp's Q5_0 fallback, held as stored
        assert {f for q in bound[GraphName.DENSE_LAYER] for _, f in q} == {"q5_0"}


def _bound(cfg, weights) -> dict[GraphName, set]:
    bound: dict[GraphName, set] = {}
    for i in range(weights.layer_start, weights.layer_end):
        kind = GraphName.MOE_LAYER if cfg.is_moe_layer(i) else GraphName.DENSE_LAYER
        bound.setdefault(kind, set()).add(quant_signature(layer_registry(cfg, i, weights.layer(i))))
        if cfg.is_moe_layer(i):
            bound.setdefault(GraphName.EXPERT, set()).add(expert_quant(weights.layer(i).routed()))
    return bound


def _gguf_types(name, shape):
    """Kept as stored on MAX (Q4_0, Q5_1, Q8_0, BF16), converted (F16), and the F32 norms/router."""
    from tests.support.gguf_files import mixed_types

    if "attn_output." in name or "ffn_down" in name:
        return "Q4_0" if shape[-1] % 32 == 0 else "F16"
    return mixed_types(name, shape)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The GGUF writer's preset (tiny-lora-yarn's q_lora tensors have no GGUF names there)."""
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

    return write_checkpoint(CheckpointRequest("tiny", tmp_path_factory.mktemp("tiny"), seed=0)).out_dir


def test_a_ggufs_variants_are_the_formats_its_max_stages_bind(tiny, tmp_path):
    """From the GGUF's stored types alone, the same graph variants (and float dtype) as the MAX
    stages built from the file bind: nothing compiled twice, nothing missed."""
    from pathlib import Path

    from libs.model.graph_variants import checkpoint_graph_variants
    from tests.support.gguf_files import write_gguf
    from tests.unit.artifact_builder.test_gguf_source import build

    gguf = tmp_path / "mixed.gguf"
    write_gguf(Path(tiny), gguf, _gguf_types)
    _, stages = build(gguf, tmp_path / "out", stages=2, backend="max")
    cfg = load_config(gguf)
    variants = checkpoint_graph_variants(gguf, cfg, "fp32")
    assert variants is not None
    bound: dict[GraphName, set] = {}
    for index, stage in enumerate(stages):
        start, end = stage.manifest.layers.layer_start, stage.manifest.layers.layer_end
        weights = load_stage_weights(stage.artifact_dir, cfg, start, end, index == 0, index == len(stages) - 1)
        assert variants.weight_dtype == weight_dtype_for(weights)
        for kind, quants in _bound(cfg, weights).items():
            bound.setdefault(kind, set()).update(quants)
    for kind, quants in bound.items():
        assert quants == set(variants.quant[kind]), kind
    held = {f for q in bound[GraphName.DENSE_LAYER] | bound[GraphName.MOE_LAYER] for _, f in q}
    assert {"q4_0", "q5_1"} <= held  # kept as stored: qmatmul runs Q4_0, the Mojo custom op Q5_1


def test_a_weight_policy_beside_a_gguf_is_refused(tiny, tmp_path):
    from pathlib import Path

    from libs.model.errors import CheckpointError
    from libs.model.graph_variants import checkpoint_graph_variants
    from tests.support.gguf_files import write_gguf

    gguf = tmp_path / "f32.gguf"
    write_gguf(Path(tiny), gguf)
    with pytest.raises(CheckpointError, match="keeps the formats it stores") as raised:
        checkpoint_graph_variants(gguf, load_config(gguf), "q4_k_m")
    assert raised.value.reason == "GGUF_WEIGHTS_POLICY"


def test_no_graph_repacks_a_block_format_weight_per_call(max_checkpoint):
    """A weight repack inside an `ops.cond` branch (every routed expert runs in one) would run on
    every call: the graphs run MAX's packed product alone, on weights repacked at bind time."""
    from max.dtype import DType
    from max.graph import DeviceRef

    from libs.model.max_graphs import GraphKind, GraphSpec, build_graph

    cfg = load_config(max_checkpoint)
    quant = (("experts_down", "q4_0"), ("experts_gate_up", "q4_k"))
    text = str(build_graph(GraphSpec(GraphKind.EXPERT, cfg, DType.float32, DeviceRef.CPU(), quant)))
    assert "vroom_q4_k_matmul" in text and "vroom_q4_0_matmul" in text
    assert "repack" not in text


def _declared(text: str, name: str) -> str:
    """The element type a graph declares weight `name` in."""
    import re

    found = re.search(rf'name = "{name}",[^\n]*!mo\.tensor<\[[^\]]*\], (\w+)>', text)
    assert found, name
    return found.group(1)


def test_a_graph_with_block_products_keeps_norms_router_and_activations_float32(max_checkpoint):
    """A q4_k_m stage on MAX holds its embeddings and kv_b in bf16, so its graphs have bf16
    weights; with block-format products they compute in float32 around them (the reference's
    math): the router and the norms are declared float32 and no activation is rounded to bf16.
    A graph of bf16 weights alone (the bf16 policy) still runs bf16 products."""
    from max.dtype import DType
    from max.graph import DeviceRef

    from libs.model.max_graphs import GraphKind, GraphSpec, build_graph, full_precision

    cfg = load_config(max_checkpoint)
    quant = (("q_b_proj", "q4_k"),)  # any block product (its out dim suits MAX's packed kernel)
    mixed = str(build_graph(GraphSpec(GraphKind.MOE_LAYER, cfg, DType.bfloat16, DeviceRef.CPU(), quant)))
    assert _declared(mixed, "router") == "f32"
    assert _declared(mixed, "input_layernorm") == "f32" and _declared(mixed, "kv_a_layernorm") == "f32"
    assert _declared(mixed, "kv_b_k") == "bf16"  # stored narrow, widened in-graph for its product
    def casts_to_bf16(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if "mo.cast" in ln and ln.rstrip().endswith("bf16>")]

    assert casts_to_bf16(mixed) == []
    plain = str(build_graph(GraphSpec(GraphKind.MOE_LAYER, cfg, DType.bfloat16, DeviceRef.CPU())))
    assert _declared(plain, "router") == "bf16" and len(casts_to_bf16(plain)) > 0
    assert full_precision("router", 2) and full_precision("input_layernorm", 1)
    assert not full_precision("kv_b_k", 3) and not full_precision("q_a_proj", 2)
