"""`greedy_agreement`: how far two engines' greedy continuations of the same prompts agree."""

from __future__ import annotations

import pytest

from apps.bench.llama_peer import greedy_agreement


def test_identical_streams_agree_on_every_token():
    streams = [(5, 6, 7), (9, 9, 9)]
    assert greedy_agreement(streams, list(streams)) == {
        "streams": 2, "identical_streams": 2, "tokens": 6, "agreeing_prefix_tokens": 6, "identical_fraction": 1.0}


def test_agreement_ends_at_each_streams_first_difference():
    ours = [(5, 6, 7, 8), (1, 2, 3, 4), (4, 4, 4, 4)]
    theirs = [(5, 6, 0, 8), (1, 2, 3, 4), (0, 4, 4, 4)]  # a later equal token does not count again
    agreement = greedy_agreement(ours, theirs)
    assert agreement["identical_streams"] == 1 and agreement["agreeing_prefix_tokens"] == 2 + 4 + 0
    assert agreement["tokens"] == 12 and agreement["identical_fraction"] == pytest.approx(1 / 3)


def test_a_shorter_stream_is_not_identical_and_counts_its_missing_tokens():
    agreement = greedy_agreement([(1, 2, 3)], [(1, 2)])
    assert agreement["identical_streams"] == 0 and agreement["agreeing_prefix_tokens"] == 2
    assert agreement["tokens"] == 3


def test_different_stream_counts_are_refused():
    with pytest.raises(ValueError, match="2 streams against 1"):
        greedy_agreement([(1,), (2,)], [(1,)])
