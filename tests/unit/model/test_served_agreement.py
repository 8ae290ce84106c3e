"""Scoring a served continuation against the reference's argmax after each served prefix."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.served_agreement import Miss, margins, overall_agreement, prompt_agreement, teacher_forced_sequence

PROMPT = [7, 8, 9]
SERVED = [4, 5, 6, 1]


def _reference_that_predicts(prompt: list[int], continuation: list[int]) -> np.ndarray:
    """Argmax per position of prompt + continuation[:-1]: the prompt's own positions predict
    nothing the score reads, except the last, which predicts continuation[0]."""
    sequence = teacher_forced_sequence(prompt, continuation)
    top1 = np.full(len(sequence), 99)
    top1[len(prompt) - 1:] = continuation
    return top1


def test_a_route_that_emits_the_references_argmax_everywhere_agrees_fully():
    assert teacher_forced_sequence(PROMPT, SERVED) == [7, 8, 9, 4, 5, 6]
    score = prompt_agreement(PROMPT, SERVED, _reference_that_predicts(PROMPT, SERVED))
    assert (score.agreed, score.positions, score.agreement, score.first_miss) == (4, 4, 1.0, None)


def test_a_deliberately_wrong_served_token_lowers_the_agreement_by_one_position():
    top1 = _reference_that_predicts(PROMPT, SERVED)
    wrong = [4, 5, 3, 1]  # the route emitted 3 where the reference's argmax is 6
    score = prompt_agreement(PROMPT, wrong, top1)
    assert (score.agreed, score.agreement, score.first_miss) == (3, 0.75, 2)
    right = prompt_agreement(PROMPT, SERVED, top1)
    assert overall_agreement([right, score]) == (7 / 8, 8)


def test_the_score_reads_the_position_before_each_served_token():
    # Shifted by one (scoring the token's own position instead of its prefix's) would miss all.
    top1 = np.array([0, 0, 4, 5, 6, 1])
    assert prompt_agreement(PROMPT, SERVED, top1).agreement == 1.0
    assert prompt_agreement(PROMPT, SERVED, np.roll(top1, 1)).agreement == 0.0


def test_too_few_reference_positions_are_refused():
    with pytest.raises(ValueError, match="cannot score"):
        prompt_agreement(PROMPT, SERVED, np.zeros(4, dtype=np.int64))


def _logits_ranking(prompt: list[int], served: list[int], order: list[list[int]], vocab: int = 10) -> np.ndarray:
    """Logits over teacher_forced_sequence(prompt, served): at the k-th scored position the ids in
    order[k] get 3.0, 2.5, 2.0, ... (best first); every other id 0.0."""
    rows = np.zeros((len(teacher_forced_sequence(prompt, served)), vocab), dtype=np.float32)
    for k, ids in enumerate(order):
        for rank, token in enumerate(ids):
            rows[len(prompt) - 1 + k, token] = 3.0 - 0.5 * rank
    return rows


def test_margins_name_each_miss_by_the_served_tokens_rank_and_logit_gap():
    served = [4, 5, 6]
    logits = _logits_ranking(PROMPT, served, [[4, 1], [1, 2, 5], [6, 3]])
    m = margins([PROMPT], [served], [logits])
    assert m.misses == (Miss(prompt=0, position=1, served_rank=2, gap=1.0),)
    assert m.first_second_gap_p50 == pytest.approx(0.5)


def test_margins_of_a_route_that_agrees_everywhere_list_no_miss():
    served = [4, 5]
    m = margins([PROMPT], [served], [_logits_ranking(PROMPT, served, [[4, 9], [5, 9]])])
    assert m.misses == ()
