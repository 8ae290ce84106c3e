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
    if policy == "q4_k_m":  # this preset's rows fit Q4_0's 32-blocks only
        assert {f for q in bound[GraphName.DENSE_LAYER] for _, f in q} == {"q4_0"}
