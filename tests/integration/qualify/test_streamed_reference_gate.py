"""On `tiny`, qualify's two references give the same figures and verdicts on the same run data:
the plan's stages against the whole float32 model and against the layer-streamed reference
(every boundary, the final logits, routed experts), and transformers' greedy ids scored
teacher forced against the streamed reference (all agreed; one wrong token is caught)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.qualify.reference import (
    RouteWeights,
    boundary_parity,
    greedy_reference,
    streamed_boundary_parity,
    token_agreement,
)
from apps.qualify.run import PROMPTS
from libs.model.config import load_config
from tests.integration.orchestrator.harness import tiny_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOLERANCE = 1e-4
# Both references are float32 transformers modules over the same weights; only the routed
# experts' summation order differs (eager loop against grouped_mm): float32 rounding.
SAME_FIGURE = 1e-5
DECODE_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("backends", [("numpy", "numpy")])
def test_streamed_and_whole_boundary_parity_agree(checkpoint, backends):
    layers = load_config(checkpoint).num_hidden_layers
    ranges = [(0, layers // 2), (layers // 2, layers)]
    whole, build_w, ref_w = boundary_parity(checkpoint, ranges, list(backends), TOLERANCE)
    streamed, build_s, ref_s = streamed_boundary_parity(checkpoint, ranges, list(backends), TOLERANCE)
    assert build_w == build_s and "one layer at a time" in ref_s and "one layer at a time" not in ref_w
    assert [b.label for b in streamed] == [b.label for b in whole]
    assert any("experts" in b.label for b in streamed) and sum("hidden after" in b.label for b in streamed) == 2
    for w, s in zip(whole, streamed, strict=True):
        assert s.passed == w.passed is True
        assert abs(s.max_abs_diff - w.max_abs_diff) <= SAME_FIGURE, (w, s)
    # A tolerance below the figures fails the same boundaries on both.
    tight = 1e-9
    fails_w = [b.label for b in boundary_parity(checkpoint, ranges, list(backends), tight)[0] if not b.passed]
    fails_s = [b.label for b in streamed_boundary_parity(checkpoint, ranges, list(backends), tight)[0]
               if not b.passed]
    assert fails_w == fails_s and "final logits" in fails_s


def test_greedy_ids_agree_with_the_streamed_reference_and_a_wrong_token_is_caught(checkpoint):
    served = [tuple(r) for r in greedy_reference(checkpoint, PROMPTS, DECODE_TOKENS)]
    weights = RouteWeights("fp32", ("numpy", "numpy"))
    agreed = token_agreement(checkpoint, weights, PROMPTS, served)
    assert agreed.passed and agreed.agreement == 1.0
    assert agreed.positions == sum(len(s) for s in served) and all(m is None for m in agreed.first_misses)
    vocab = load_config(checkpoint).vocab_size
    wrong = list(served)
    wrong[1] = (*served[1][:3], (served[1][3] + 1) % vocab, *served[1][4:])
    missed = token_agreement(checkpoint, weights, PROMPTS, wrong)
    assert not missed.passed and missed.first_misses[1] == 3
    # The wrong token is disputed; the ones after it follow a prefix the reference never produced.
    assert missed.agreement <= 1 - 1 / agreed.positions
