"""The parity rules qualify applies whichever reference feeds them: float32-exact routes (fp32
weights, fp32 hops) need every boundary within tolerance, no differing expert and every served
token agreed; a route that cannot be exact (block formats on a MAX stage, a bf16 or fp16 hop)
is gated on the final logits' top-1 and the served tokens' teacher-forced top-1
(MAX_BLOCK_TOP1_MIN), and says which gate applied and why."""

from __future__ import annotations

import numpy as np
import pytest

from apps.qualify.gate import Check
from apps.qualify.reference import (
    RouteRefused,
    RouteWeights,
    TokenAgreement,
    _figures,
    route_hops,
    route_weights,
    with_token_agreement,
)
from libs.common.kinds import DType
from libs.model.parity import MAX_BLOCK_TOP1_MIN, Captured

RANGES = [(0, 1), (1, 2)]
ROWS, VOCAB = 20, 8


def _captured(shift: float, flip_rows: int = 0, expert: int = 0) -> Captured:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(ROWS, VOCAB)).astype(np.float32)
    logits[np.arange(ROWS), 0] = 10.0  # top-1 is id 0 on every row
    logits[:flip_rows, 0] = -10.0
    hidden = {0: {"a": [rng.normal(size=(ROWS, 4)).astype(np.float32) + shift]},
              1: {"a": [np.ones((ROWS, 4), np.float32) + shift]}}
    experts = {1: {"a": [np.full((ROWS, 2), expert, np.int32)]}}
    return Captured(hidden, {"a": [logits + shift]}, experts)


def _ours_ref(shift: float, flip_rows: int = 0, expert: int = 0) -> tuple[Captured, Captured]:
    """Ours keys boundaries by stage, the reference by layer: with RANGES they coincide."""
    return _captured(shift, flip_rows, expert), _captured(0.0)


def test_fp32_routes_gate_every_boundary_and_expert():
    weights = RouteWeights("fp32", ("numpy", "max"))
    ours, ref = _ours_ref(1e-6)
    assert all(b.passed and b.gated for b in _figures(ours, ref, RANGES, 1e-4, weights))
    ours, ref = _ours_ref(1e-3)
    failed = [b.label for b in _figures(ours, ref, RANGES, 1e-4, weights) if not b.passed]
    assert failed == ["stage 0 [0,1) hidden after layer 0", "stage 1 [1,2) hidden after layer 1", "final logits"]
    ours, ref = _ours_ref(0.0, expert=3)
    failed = [b for b in _figures(ours, ref, RANGES, 1e-4, weights) if not b.passed]
    assert [(b.label, b.max_abs_diff) for b in failed] == [("layer 1 experts: rows differing", ROWS)]


def test_block_formats_on_max_gate_the_final_top1_and_state_the_boundaries():
    weights = RouteWeights("q4_k_m", ("max", "max"))
    assert weights.max_blocks and weights.token_agreement_min == MAX_BLOCK_TOP1_MIN
    ours, ref = _ours_ref(1e-2, flip_rows=1)  # 0.95 of rows agree: passes
    figures = _figures(ours, ref, RANGES, 1e-4, weights)
    inner = [b for b in figures if "hidden after" in b.label]
    assert inner and all(not b.gated and b.passed and b.max_abs_diff > 1e-4 for b in inner)
    (final,) = [b for b in figures if b.label == "final logits"]
    assert final.measure == "top-1 disagreement" and final.passed
    assert final.max_abs_diff == pytest.approx(1 / ROWS)
    ours, ref = _ours_ref(1e-2, flip_rows=2)  # 0.90
    (final,) = [b for b in _figures(ours, ref, RANGES, 1e-4, weights) if b.label == "final logits"]
    assert not final.passed


@pytest.mark.parametrize("policy,backends", [("q4_k_m", ("numpy", "numpy")), ("fp32", ("max",)),
                                             ("bf16", ("max", "numpy"))])
def test_exact_routes_need_every_token_agreed(policy, backends):
    weights = RouteWeights(policy, backends)
    assert not weights.max_blocks and weights.token_agreement_min == 1.0


def _agreement(share: float, minimum: float) -> TokenAgreement:
    return TokenAgreement(share, 40, minimum, (None, 3), "streamed")


def test_token_agreement_below_its_minimum_fails_token_parity_only():
    checks = [Check("prefill", True, "ok"), Check("token_parity", True, "streams equal")]
    out = with_token_agreement(checks, _agreement(0.975, 1.0))
    assert out[0] == checks[0]
    assert not out[1].passed and "top-1 agreement 0.975 over 40 positions (minimum 1)" in out[1].detail
    assert "prompt 1 at token 3" in out[1].detail
    assert with_token_agreement(checks, _agreement(0.975, MAX_BLOCK_TOP1_MIN))[1].passed


def test_a_failed_stream_check_stays_failed_whatever_the_agreement():
    checks = [Check("token_parity", False, "stream differs")]
    assert not with_token_agreement(checks, _agreement(1.0, 1.0))[0].passed
    assert with_token_agreement(checks, None) == checks


def test_one_policy_over_the_route_or_a_refusal_naming_them():
    assert route_weights(["q4_k_m", "q4_k_m"], ["max", "numpy"]) == RouteWeights("q4_k_m", ("max", "numpy"))
    with pytest.raises(RouteRefused, match=r"\['q4_k_m', 'q8_0'\]") as mixed:
        route_weights(["q4_k_m", "q8_0"], ["max", "max"])
    assert mixed.value.reason == "MIXED_WEIGHT_POLICIES"
    assert route_weights(["fp32"] * 2, ["numpy"] * 2, [BF16]).hops == (BF16,)


BF16, FP32, FP16 = DType.BF16, DType.FP32, DType.FP16


def test_fp32_weights_over_fp32_hops_keep_the_strict_rules():
    for hops in [(), (FP32,), (FP32, FP32)]:
        weights = RouteWeights("fp32", ("numpy",) * (len(hops) + 1), hops)
        assert weights.exact and weights.token_agreement_min == 1.0 and weights.inexact_because() == ()
        assert weights.describe_gates().startswith("exact gates: max |diff|")
        assert weights.boundary_dtype is FP32


@pytest.mark.parametrize("hops,named", [((BF16,), "hop 0>1 carries bf16"), ((FP32, BF16), "hop 1>2 carries bf16"),
                                        ((FP16, FP32), "hop 0>1 carries fp16")])
def test_a_rounding_hop_makes_the_gates_top1_and_says_which_hop(hops, named):
    weights = RouteWeights("fp32", ("numpy",) * (len(hops) + 1), hops)
    assert not weights.exact and not weights.max_blocks
    assert weights.token_agreement_min == MAX_BLOCK_TOP1_MIN
    (why,) = weights.inexact_because()
    assert named in why and "carries fp32" not in why
    gates = weights.describe_gates()
    assert gates.startswith(f"top-1 gates: final logits' top-1 agreement >= {MAX_BLOCK_TOP1_MIN:g}")
    assert "teacher-forced" in gates and named in gates


def test_block_formats_and_a_bf16_hop_give_both_reasons():
    weights = RouteWeights("q4_k_m", ("max", "max", "max"), (BF16, BF16))
    assert weights.inexact_because() == (
        "q4_k_m on MAX stages 0, 1, 2 (its graphs quantize activations)",
        "hop 0>1 carries bf16, 1>2 carries bf16 (rounds the hidden states; the staged run applies the same rounding)")
    assert weights.boundary_dtype is BF16


def test_the_widest_hop_is_the_routes_boundary_dtype():
    assert RouteWeights("fp32", ("numpy",) * 3, (BF16, FP32)).boundary_dtype is FP32
    assert RouteWeights("fp32", ("numpy",) * 3, (BF16, FP16)).boundary_dtype is BF16


def test_a_bf16_hop_states_boundaries_and_experts_and_gates_the_final_top1():
    weights = RouteWeights("fp32", ("numpy", "numpy"), (BF16,))
    ours, ref = _ours_ref(1e-2, flip_rows=1, expert=3)  # 0.95 of rows agree; every expert row differs
    figures = _figures(ours, ref, RANGES, 1e-4, weights)
    stated = [b for b in figures if b.label != "final logits"]
    assert [b.label for b in stated] == ["stage 0 [0,1) hidden after layer 0", "stage 1 [1,2) hidden after layer 1",
                                         "layer 1 experts: rows differing"]
    assert all(not b.gated and b.passed for b in stated) and stated[-1].max_abs_diff == ROWS
    (final,) = [b for b in figures if b.label == "final logits"]
    assert final.gated and final.measure == "top-1 disagreement" and final.passed
    ours, ref = _ours_ref(1e-2, flip_rows=2)  # 0.90: fails
    assert not [b for b in _figures(ours, ref, RANGES, 1e-4, weights) if b.label == "final logits"][0].passed
    # The same figures over an fp32 hop fail every boundary, the experts and the logits.
    ours, ref = _ours_ref(1e-2, flip_rows=1, expert=3)
    exact = _figures(ours, ref, RANGES, 1e-4, RouteWeights("fp32", ("numpy", "numpy"), (FP32,)))
    assert all(b.gated and not b.passed for b in exact)


def test_route_hops_follow_the_fleet_file():
    assert route_hops((BF16, FP32), 3) == (BF16, FP32)
    assert route_hops((BF16, BF16), 2) == (BF16,)  # a route over fewer stages: the file's one dtype
    assert route_hops((), 2) == (FP32,)
    assert route_hops((BF16,), 1) == ()


def test_route_hops_refuse_what_cannot_be_compared_with_a_reason():
    with pytest.raises(RouteRefused, match="2 stages but the fleet file lists 2 hops of unlike dtypes") as mixed:
        route_hops((BF16, FP32), 2)
    assert mixed.value.reason == "HOP_DTYPES_MISMATCH"
    with pytest.raises(RouteRefused, match="int32") as ints:
        route_hops((DType.INT32,), 2)
    assert ints.value.reason == "HOP_DTYPE_UNSUPPORTED"
