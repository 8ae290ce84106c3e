"""Stage plans and tensor ownership, including tied embeddings and the union check."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.model.config import parse_config
from libs.model.layout import expected_tensors
from services.artifact_builder.errors import PlanInvalidError, UnionMismatchError
from services.artifact_builder.snapshot import SourceTensor
from services.artifact_builder.staging import (
    OwnedTensor,
    StageRange,
    assign_tensors,
    check_union,
    even_layer_ranges,
    plan_from_ranges,
    validate_plan,
)
from tests.unit.artifact_builder.fixtures import TINY_CONFIG

EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"


def _model(tied: bool, layers: int = 4):
    cfg = parse_config(dict(TINY_CONFIG, tie_word_embeddings=tied, num_hidden_layers=layers))
    tensors = {
        name: SourceTensor(name, spec.dtype, spec.shape, "model.safetensors", i * 8, 8)
        for i, (name, spec) in enumerate(expected_tensors(cfg, "F32").items())
    }
    return cfg, tensors


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else None


@given(st.integers(1, 40), st.data())
def test_even_ranges_cover_every_layer_once(num_layers, data):
    stages = data.draw(st.integers(1, num_layers))
    ranges = even_layer_ranges(num_layers, stages)
    covered = [layer for start, end in ranges for layer in range(start, end)]
    assert covered == list(range(num_layers))
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_more_stages_than_layers_is_refused():
    with pytest.raises(PlanInvalidError):
        even_layer_ranges(3, 4)


@pytest.mark.parametrize("ranges", [((0, 2), (3, 4)), ((0, 2), (1, 4)), ((0, 2), (2, 2), (2, 4)), ((0, 3),), ()])
def test_gaps_overlaps_empty_and_short_plans_are_refused(ranges):
    with pytest.raises(PlanInvalidError):
        validate_plan(plan_from_ranges(ranges), num_layers=4)


def test_untied_ownership():
    cfg, tensors = _model(tied=False)
    plan = plan_from_ranges(((0, 1), (1, 3), (3, 4)))
    stages = assign_tensors(cfg, plan, tensors)
    names = [{t.name for t in s.tensors} for s in stages]
    assert EMBED in names[0] and EMBED not in names[1] | names[2]
    assert {NORM, HEAD} <= names[2] and not {NORM, HEAD} & (names[0] | names[1])
    for stage, owned in zip(plan.stages, names, strict=True):
        layers = {_layer_of(n) for n in owned} - {None}
        assert layers == set(range(stage.layer_start, stage.layer_end))
    # router, shared and routed experts of MoE layer 2 travel with it
    assert "model.layers.2.mlp.gate.weight" in names[1]
    assert "model.layers.2.mlp.shared_experts.down_proj.weight" in names[1]
    assert {f"model.layers.2.mlp.experts.{e}.up_proj.weight" for e in range(4)} <= names[1]
    assert all(s.tied_copies == () for s in stages)
    assert all(t.name == t.source.name for s in stages for t in s.tensors)


def test_tied_ownership_gives_the_last_stage_an_explicit_head_copy():
    cfg, tensors = _model(tied=True)
    stages = assign_tensors(cfg, plan_from_ranges(((0, 2), (2, 4))), tensors)
    first, last = ({t.name: t for t in s.tensors} for s in stages)
    assert EMBED in first and HEAD not in first
    assert EMBED not in last and NORM in last
    assert last[HEAD].source.name == EMBED
    assert stages[1].tied_copies == (HEAD,) and stages[0].tied_copies == ()


def test_single_tied_stage_holds_embeddings_and_the_head_copy():
    cfg, tensors = _model(tied=True)
    [stage] = assign_tensors(cfg, plan_from_ranges(((0, 4),)), tensors)
    owned = {t.name: t for t in stage.tensors}
    assert owned[EMBED].source.name == EMBED and owned[HEAD].source.name == EMBED
    assert len(owned) == len(tensors) + 1


@pytest.mark.parametrize("tied", [False, True])
def test_union_equals_checkpoint_plus_declared_copy(tied):
    cfg, tensors = _model(tied=tied, layers=5)
    for count in range(1, 6):
        stages = assign_tensors(cfg, plan_from_ranges(even_layer_ranges(5, count)), tensors)
        placed = [t.name for s in stages for t in s.tensors]
        assert len(placed) == len(set(placed))
        assert set(placed) == set(tensors) | ({HEAD} if tied else set())


def test_union_check_catches_duplicates_missing_and_undeclared_copies():
    cfg, tensors = _model(tied=False)
    stages = assign_tensors(cfg, plan_from_ranges(((0, 2), (2, 4))), tensors)
    duplicated = (stages[0], replace(stages[1], tensors=stages[1].tensors + (stages[0].tensors[0],)))
    with pytest.raises(UnionMismatchError, match="more than one stage"):
        check_union(cfg, duplicated, set(tensors))
    dropped = (stages[0], replace(stages[1], tensors=stages[1].tensors[1:]))
    with pytest.raises(UnionMismatchError, match="missing"):
        check_union(cfg, dropped, set(tensors))
    renamed = OwnedTensor("model.norm.weight", tensors["model.layers.3.input_layernorm.weight"])
    forged = tuple(t for t in stages[1].tensors if t.name != "model.norm.weight") + (renamed,)
    with pytest.raises(UnionMismatchError, match="undeclared copy"):
        check_union(cfg, (stages[0], replace(stages[1], tensors=forged)), set(tensors))


def test_explicit_ranges_get_a_stable_plan_hash():
    a = plan_from_ranges(((0, 2), (2, 4)))
    assert a == plan_from_ranges(((0, 2), (2, 4)))
    assert a.plan_hash != plan_from_ranges(((0, 1), (1, 4))).plan_hash
    assert a.plan_hash.startswith("sha256:") and a.stages[1] == StageRange(1, 2, 4)


@given(st.integers(1, 8), st.booleans(), st.data())
def test_any_contiguous_plan_places_every_tensor_exactly_once(num_layers, tied, data):
    cfg, tensors = _model(tied=tied, layers=num_layers)
    cuts = sorted(data.draw(st.sets(st.integers(1, num_layers - 1), max_size=num_layers - 1))) if num_layers > 1 else []
    bounds = [0, *cuts, num_layers]
    stages = assign_tensors(cfg, plan_from_ranges(tuple(pairwise(bounds))), tensors)
    placed = [(t.name, s.stage.stage_index) for s in stages for t in s.tensors]
    assert sorted(n for n, _ in placed) == sorted(set(tensors) | ({HEAD} if tied else set()))
    last = len(stages) - 1
    for name, index in placed:
        layer = _layer_of(name)
        if layer is not None:
            stage = stages[index].stage
            assert stage.layer_start <= layer < stage.layer_end
        elif name == EMBED:
            assert index == 0
        else:
            assert name in (NORM, HEAD) and index == last
