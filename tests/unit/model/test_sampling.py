"""Sampling: greedy, seeded reproducibility, top-k / top-p support, validation, executor wiring."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.model.errors import BatchError
from libs.model.sampling import GREEDY, SamplingParams, candidate_probabilities, sample_token

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], dtype=np.float32))


def test_greedy_is_argmax():
    assert sample_token(LOGITS, GREEDY, position=3) == 1


def test_same_seed_and_position_reproduce_and_seeds_differ():
    params = SamplingParams(temperature=1.0, seed=11)
    first = [sample_token(LOGITS, params, p) for p in range(200)]
    assert first == [sample_token(LOGITS, params, p) for p in range(200)]
    other = [sample_token(LOGITS, SamplingParams(temperature=1.0, seed=12), p) for p in range(200)]
    assert first != other
    assert set(first) == {0, 1, 2, 3, 4}


def test_empirical_frequencies_follow_the_distribution():
    params = SamplingParams(temperature=1.0, seed=5)
    draws = np.bincount([sample_token(LOGITS, params, p) for p in range(4000)], minlength=5) / 4000
    np.testing.assert_allclose(draws, np.exp(LOGITS), atol=0.03)


def test_top_k_restricts_support():
    params = SamplingParams(temperature=1.0, top_k=2, seed=1)
    assert {sample_token(LOGITS, params, p) for p in range(300)} == {1, 3}


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = candidate_probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.75))
    assert set(np.flatnonzero(probs)) == {1, 3, 4}
    np.testing.assert_allclose(probs[[1, 3, 4]], np.array([0.4, 0.3, 0.15]) / 0.85, rtol=1e-5)
    tiny_p = candidate_probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.01))
    assert set(np.flatnonzero(tiny_p)) == {1}


def test_low_temperature_sharpens():
    cold = candidate_probabilities(LOGITS, SamplingParams(temperature=0.1))
    assert cold[1] > 0.9


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=40),
    top_k=st.integers(0, 10),
    top_p=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**31),
    position=st.integers(0, 10_000),
)
def test_sampled_token_always_lies_in_the_support(logits, top_k, top_p, seed, position):
    row = np.array(logits, dtype=np.float32)
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p, seed=seed)
    probs = candidate_probabilities(row, params)
    token = sample_token(row, params, position)
    assert probs[token] > 0
    assert np.isclose(probs.sum(), 1.0)
    if top_k:
        assert row[token] >= np.sort(row)[-min(top_k, row.size)]


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=-1.0), SamplingParams(top_k=-1), SamplingParams(top_p=0.0), SamplingParams(top_p=1.5),
     SamplingParams(seed=-3)],
)
def test_invalid_parameters_are_rejected(params):
    with pytest.raises(BatchError):
        sample_token(LOGITS, params, 0)


def test_executor_samples_last_row_per_sequence(tiny_checkpoint):
    from libs.model.executor import StageBatch
    from tests.unit.model.test_executor import TOKENS, ident, make_executor

    batch = StageBatch(
        (ident("a", 0, 0, 7), ident("b", 0, 0, 3)), np.concatenate([TOKENS["a"], TOKENS["b"]]),
        sampling=(GREEDY, SamplingParams(temperature=0.8, top_k=5, seed=9)),
    )
    result = make_executor(tiny_checkpoint).execute(batch)
    again = make_executor(tiny_checkpoint).execute(batch)
    assert result.logits.shape == (2, 512) and result.token_ids.dtype == np.int32
    assert result.token_ids[0] == int(np.argmax(result.logits[0]))
    assert result.token_ids[1] in np.argsort(result.logits[1])[-5:]
    assert result.token_ids.tolist() == again.token_ids.tolist()
