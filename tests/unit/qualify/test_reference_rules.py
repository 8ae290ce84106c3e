"""The parity rules qualify applies whichever reference feeds them: float32-exact routes need
every boundary within tolerance, no differing expert and every served token agreed; block
formats on a MAX stage are gated on the final logits' top-1 (MAX_BLOCK_TOP1_MIN)."""

from __future__ import annotations

import numpy as np
import pytest

from apps.qualify.gate import Check
from apps.qualify.reference import RouteWeights, TokenAgreement, _figures, route_weights, with_token_agreement
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
    inner = [b for b in figures if b.label != "final logits"]
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
    with pytest.raises(ValueError, match=r"\['q4_k_m', 'q8_0'\]"):
        route_weights(["q4_k_m", "q8_0"], ["max", "max"])
