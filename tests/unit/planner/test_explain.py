"""`plan --explain` and `--replan` text, and profile plans across the planner's protobuf edge."""

from __future__ import annotations

from dataclasses import replace

from fornax.planner.v1 import planner_pb2 as pb
from services.planner import convert
from services.planner.client import create_plan_request
from services.planner.explain import InstalledStage, diff_lines, explain_lines
from services.planner.profiles import book_from_records
from tests.unit.planner.test_profile_planning import MODEL, TWO, inventory, records, run


def test_explain_names_every_term_its_class_and_records_and_labels_tokens_per_s_a_prediction():
    lines = "\n".join(explain_lines(run(records(1e-3, 3e-3)).plan))
    for term in ("compute", "pack", "wire", "unpack", "memory"):
        assert f"  {term} " in lines
    assert "physical (prediction from layer profiles; measurement records stage-a)" in lines
    assert "physical (prediction from layer profiles; measurement records link-a-b)" in lines
    assert "decode_tokens_per_s" in lines and "tokens/s (prediction)" in lines
    assert "computed from physical measurements" in lines


def test_explain_of_a_gap_filled_plan_says_declared_exploratory():
    lines = "\n".join(explain_lines(run(records(link=False)).plan))
    assert "declared, exploratory" in lines and "declared link bandwidth and latency" in lines


def test_replan_diff_marks_moved_stages_and_says_when_nothing_moves():
    proposed = run(records(1e-3, 3e-3)).plan
    even = [InstalledStage(0, "a", "a", 0, 6), InstalledStage(1, "b", "b", 6, 12)]
    text = diff_lines(even, proposed)
    assert text[0].startswith("replan: proposed placement differs")
    assert any(line.startswith("* stage 1: b [6, 12) 6 layers") for line in text)
    same = [InstalledStage(i, s.node, s.host, s.layer_start, s.layer_end) for i, s in enumerate(proposed.stages)]
    assert diff_lines(same, proposed) == ["replan: the proposed placement equals the installed one; nothing to move"]


def test_profile_records_and_term_evidence_cross_the_wire_unchanged():
    recs = records()
    request = create_plan_request(MODEL, inventory("a", "b"), TWO, profiles=recs)
    request = pb.CreatePlanRequest.FromString(request.SerializeToString())
    back = convert.profiles_from_request(request)
    assert back == [replace(r, labels=tuple(sorted(r.labels))) for r in recs]
    assert convert.profiles_from_request(pb.CreatePlanRequest()) is None  # absent: plan from declared figures
    plan = run(recs).plan
    again = convert.plan_from_proto(pb.Plan.FromString(convert.plan_to_proto(plan).SerializeToString()))
    assert again.route_key == plan.route_key and again.evidence_ids == plan.evidence_ids
    assert [s.terms for s in again.stages] == [s.terms for s in plan.stages]
    assert [s.host for s in again.stages] == ["a", "b"]
    assert book_from_records(back).record_ids == book_from_records(recs).record_ids


def test_replan_predicts_the_installed_placement_on_the_same_evidence():
    from services.planner.planner import predict_placement
    from tests.unit.planner.profile_factories import NOW

    recs = records(1e-3, 3e-3)
    proposed = run(recs).plan
    even = predict_placement(MODEL, inventory("a", "b"), TWO, book_from_records(recs), [("a", 0, 6), ("b", 6, 12)],
                             now_unix_ns=NOW)
    assert [(s.layer_start, s.layer_end) for s in even.stages] == [(0, 6), (6, 12)]
    assert even.prediction("decode_tokens_per_s") < proposed.prediction("decode_tokens_per_s")
    installed = [InstalledStage(0, "a", "a", 0, 6), InstalledStage(1, "b", "b", 6, 12)]
    text = "\n".join(diff_lines(installed, proposed, even))
    assert "installed " in text and " -> proposed " in text and "tokens/s" in text
