"""Which graphs a route needs, who compiles them, and the cache markers that say they exist."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given
from hypothesis import strategies as st

from libs.model.compile_cache import (
    GraphName,
    GraphTarget,
    assign_compiles,
    config_sha256,
    is_cached,
    marker_path,
    record_compiled,
    stage_graphs,
)
from libs.model.config import parse_config
from libs.model.presets import preset_config

G = GraphName


def _tiny():
    return parse_config(preset_config("tiny", 0, 1))


def test_stage_graphs_follow_the_layer_kinds_and_the_ends():
    cfg = _tiny()
    layers = cfg.num_hidden_layers
    moe = [i for i in range(layers) if cfg.is_moe_layer(i)]
    dense = [i for i in range(layers) if not cfg.is_moe_layer(i)]
    assert moe and dense, "the tiny preset mixes dense and MoE layers"
    whole = stage_graphs(cfg, 0, layers, True, True)
    assert set(whole) == set(GraphName)
    only_dense = stage_graphs(cfg, dense[0], dense[0] + 1, False, False)
    assert only_dense == (G.DENSE_LAYER,)
    last_moe = stage_graphs(cfg, moe[-1], moe[-1] + 1, False, True)
    assert last_moe == (G.MOE_LAYER, G.EXPERT, G.FINAL)


def test_each_graph_is_compiled_once_and_work_is_spread():
    needs = [(G.EMBED, G.DENSE_LAYER, G.MOE_LAYER, G.EXPERT), (G.MOE_LAYER, G.EXPERT, G.FINAL)]
    assigned = assign_compiles(needs)
    flat = [name for names in assigned for name in names]
    assert sorted(flat, key=lambda n: n.value) == sorted(GraphName, key=lambda n: n.value)
    assert {len(names) for names in assigned} == {2, 3}
    for stage, names in enumerate(assigned):
        assert set(names) <= set(needs[stage])


@given(st.lists(st.sets(st.sampled_from(list(GraphName))), min_size=1, max_size=6))
def test_assignment_covers_every_needed_graph_exactly_once(needs):
    assigned = assign_compiles([tuple(n) for n in needs])
    flat = [name for names in assigned for name in names]
    assert len(flat) == len(set(flat))
    assert set(flat) == set().union(*needs)
    assert all(set(a) <= n for a, n in zip(assigned, needs, strict=True))


def test_markers_are_keyed_by_build_and_config(tmp_path):
    cfg = _tiny()
    target = GraphTarget(G.DENSE_LAYER, "max 1.0", "cpu", "float32", config_sha256(cfg))
    assert not is_cached(tmp_path, target)
    path = record_compiled(tmp_path, target, 12.5)
    assert path == marker_path(tmp_path, target) and is_cached(tmp_path, target)
    assert json.loads(path.read_text())["compile_seconds"] == 12.5
    other_build = dataclasses.replace(target, build="max 2.0")
    other_shape = dataclasses.replace(target, config_sha256=config_sha256(
        dataclasses.replace(cfg, hidden_size=cfg.hidden_size * 2)))
    other_kind = dataclasses.replace(target, name=G.MOE_LAYER)
    assert not any(is_cached(tmp_path, t) for t in (other_build, other_shape, other_kind))
    assert len({t.key for t in (target, other_build, other_shape, other_kind)}) == 4


def test_a_custom_op_graph_key_follows_the_activations_and_the_kernel_sources(monkeypatch):
    from libs.model import compile_cache

    base = GraphTarget(GraphName.FINAL, "max 26.7.0", "cpu", "float32", "c" * 64, (("lm_head", "q4_k"),))
    f32 = dataclasses.replace(base, activations="float32")
    q8 = dataclasses.replace(base, quant=(("lm_head", "q8_0"),))
    before = (base.key, f32.key, q8.key)
    assert len(set(before)) == 3
    monkeypatch.setattr(compile_cache, "sources_sha256", lambda sources, build: "other kernels " + build)
    assert f32.key != before[1] and q8.key != before[2]  # custom-op graphs: new kernel sources, new key
    assert base.key == before[0]  # a qmatmul-only graph is not keyed by the kernels
