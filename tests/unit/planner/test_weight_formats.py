"""A node must run the weight formats its backend's build holds under the model's policy: the
worker reports them, the planner checks them (MISSING_WEIGHT_FORMAT), and both survive protobuf."""

from __future__ import annotations

from dataclasses import replace

from fornax.planner.v1 import planner_pb2 as pb
from libs.model.presets import preset_config
from libs.weights.policy import MAX_FORMATS, runnable_formats
from services.planner import domain as d
from services.planner.convert import inventory_from_request, inventory_to_request, model_from_proto, model_to_proto
from services.planner.feasibility import node_rejection
from services.planner.inventory import Target
from services.planner.model import describe_config
from services.planner.planner import plan
from tests.unit.planner.factories import full_mesh, node

SNAP = "sha256:" + "2" * 64


def small(policy=None):
    return describe_config(preset_config("small", 0, 1), snapshot=SNAP, policy=policy)


def test_a_policy_names_the_formats_of_each_backend_build():
    q4 = small("q4_k_m")
    numpy, max_ = set(q4.formats_for("numpy")), set(q4.formats_for("max"))
    assert {"q4_k", "q6_k", "fp32"} <= numpy and max_ <= MAX_FORMATS
    assert {"q5_0", "q8_0"} <= numpy & max_  # llama.cpp's fallbacks: the MAX build holds them as stored too
    assert small().weight_formats == () and small("bf16").formats_for("max") == ("bf16", "fp32")
    assert runnable_formats("numpy") > runnable_formats("max")


def test_a_node_that_cannot_run_the_formats_is_rejected_naming_them():
    model = small("q4_k_m")
    float_only = replace(node("a"), weight_formats=("bf16", "fp32"))
    full = replace(node("b"), weight_formats=tuple(sorted(MAX_FORMATS)))
    result = plan(model, full_mesh(float_only, full), Target(max_stages=2))
    rejected = {r.subject: r for r in result.rejections}
    assert rejected["a"].reason == d.MISSING_WEIGHT_FORMAT and "q4_k" in rejected["a"].detail
    assert "b" not in rejected and result.feasible


def test_an_unreported_node_passes_exploration_and_is_refused_in_deployment():
    model = small("q4_k_m")
    silent = node("a")
    assert plan(model, full_mesh(silent), Target(max_stages=1)).feasible
    refused = node_rejection(silent, model, Target(max_stages=1, mode="deployment"), 0)
    assert refused is not None and refused.reason == d.MISSING_WEIGHT_FORMAT and "none reported" in refused.detail
    assert node_rejection(silent, small(), Target(max_stages=1, mode="deployment"), 0).reason == d.MISSING_EVIDENCE


def test_formats_cross_protobuf():
    model = small("q4_k_m")
    assert model_from_proto(model_to_proto(model)).weight_formats == model.weight_formats
    request = pb.CreatePlanRequest()
    inventory = full_mesh(replace(node("a"), weight_formats=("fp32", "q4_k")))
    inventory_to_request(inventory, request)
    assert inventory_from_request(request).nodes[0].weight_formats == ("fp32", "q4_k")
