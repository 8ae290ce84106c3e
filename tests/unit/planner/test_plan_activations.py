"""A plan names each MAX stage's block-format activations: the mode of the node it was placed on
(int8 where the node reports none, the worker's default; float32 where it says so), "" on a
numpy stage. The mode crosses the planner's proto both ways, counts in the plan hash only when
set (a numpy plan keeps the hash it had before), and `fornax plan` prints it."""

from __future__ import annotations

from dataclasses import asdict, replace

from apps.cli.plan import format_result
from services.planner import convert
from services.planner import domain as d
from services.planner.inventory import Target
from services.planner.planner import plan
from services.planner.profiles import book_from_records
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import NOW, link_profile, link_record, stage_profile, stage_record

MODEL = tiny_model(layers=12)
TWO = Target(context_tokens=512, concurrency=4, min_stages=2, max_stages=2, prefill_tokens=64)


def _plan(a_backend: str = "max", a_mode: str = "", b_backend: str = "max", b_mode: str = "") -> d.Plan:
    inventory = full_mesh(replace(node("a"), backend=a_backend, max_activations=a_mode),
                          replace(node("b"), backend=b_backend, max_activations=b_mode))
    result = plan(MODEL, inventory, TWO)
    assert result.feasible and result.plan is not None
    return result.plan


def _modes(p: d.Plan) -> dict[str, str]:
    return {s.node: s.max_activations for s in p.stages}


def test_a_max_stage_carries_its_nodes_mode_int8_where_unreported():
    assert _modes(_plan()) == {"a": "int8", "b": "int8"}
    assert _modes(_plan(a_mode="float32")) == {"a": "float32", "b": "int8"}
    assert _modes(_plan(a_mode="int8", b_mode="float32")) == {"a": "int8", "b": "float32"}


def test_a_numpy_stage_carries_no_mode():
    assert _modes(_plan(a_backend="numpy", b_backend="numpy")) == {"a": "", "b": ""}
    assert _modes(_plan(a_backend="numpy", b_mode="float32")) == {"a": "", "b": "float32"}


def test_a_plan_from_profiles_carries_the_mode_too():
    snap = MODEL.model_snapshot
    recs = [stage_record(replace(stage_profile(h, snap, measured=NOW - 10**9), max_activations=m), f"stage-{h}")
            for h, m in (("a", "float32"), ("b", "int8"))] + [link_record(link_profile("a", "b"))]
    inventory = full_mesh(replace(node("a"), max_activations="float32"), node("b"))
    result = plan(MODEL, inventory, TWO, profiles=book_from_records(recs), now_unix_ns=NOW)
    assert result.plan is not None and result.plan.from_profiles
    assert {s.host: s.max_activations for s in result.plan.stages} == {"a": "float32", "b": "int8"}


def test_the_mode_survives_the_proto_both_ways():
    planned = _plan(a_backend="numpy", b_mode="float32")
    wire = convert.plan_to_proto(planned)
    assert [s.max_activations for s in wire.stages] == [s.max_activations for s in planned.stages]
    assert sorted(s.max_activations for s in wire.stages) == ["", "float32"]
    back = convert.plan_from_proto(wire)
    assert [s.max_activations for s in back.stages] == [s.max_activations for s in planned.stages]
    assert convert.plan_from_proto(convert.plan_to_proto(back)) == back


def test_a_numpy_plan_keeps_the_hash_it_had_before_the_field():
    planned = _plan(a_backend="numpy", b_backend="numpy")
    content = {"model_snapshot": MODEL.model_snapshot, "mode": TWO.mode, "target": asdict(TWO), "stages": [
        {"node": s.node, "backend": s.backend, "build": s.build, "layer_start": s.layer_start,
         "layer_end_exclusive": s.layer_end, "owns_embeddings": s.owns_embeddings, "owns_head": s.owns_head}
        for s in planned.stages]}
    assert (planned.plan_id, planned.plan_hash) == d.plan_identity(content)


def test_the_mode_is_part_of_a_max_plans_hash():
    int8, float32 = _plan(), _plan(a_mode="float32")
    assert [(s.node, s.layer_start, s.layer_end) for s in int8.stages] == [
        (s.node, s.layer_start, s.layer_end) for s in float32.stages]
    assert int8.plan_hash != float32.plan_hash and int8.plan_id != float32.plan_id
    assert _plan(a_mode="int8").plan_hash == int8.plan_hash  # int8 reported or defaulted: one mode


def test_fornax_plan_prints_what_each_stage_runs():
    result = plan(MODEL, full_mesh(replace(node("a"), backend="numpy"),
                                   replace(node("b"), max_activations="float32")), TWO)
    assert result.plan is not None and [s.node for s in result.plan.stages] == ["a", "b"]
    runs = [line for line in format_result(result) if line.startswith("runs: ")]
    assert runs == ["runs: stage 0 numpy test-build; stage 1 max test-build (float32 activations)"]
