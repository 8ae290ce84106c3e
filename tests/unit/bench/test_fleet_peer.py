"""The fleet bench's llama.cpp part: the same prompts per level, the ratios and the report."""

from __future__ import annotations

import pytest

from apps.bench.fleet_peer import PeerRun, greedy_vs_llama_cpp, level_batches, peer_report, vs_llama_cpp
from apps.bench.llama_peer import LlamaPeerOptions
from apps.bench.serve import prompts


def test_each_level_gets_the_prompt_ids_the_fleet_got():
    run = PeerRun(LlamaPeerOptions("s", "g"), vocab=500, prompt_tokens=12, max_tokens=4, concurrency=(1, 4, 8))
    batches = level_batches(run)
    assert list(batches) == ["c1", "c4", "c8"]
    assert batches["c4"] == prompts(500, 4, 12, seed=4)  # the fleet bench's seed per level
    assert [len(b) for b in batches.values()] == [1, 4, 8] and len(batches["c8"][0]) == 12


def test_the_ratio_is_fornax_over_llama_cpp_per_level():
    fleet = {"c1": {"output_tokens_per_s": 3.0}, "c8": {"output_tokens_per_s": 18.0},
             "c4": {"output_tokens_per_s": 9.0}}
    peer = {"c1": {"output_tokens_per_s": 6.0}, "c8": {"output_tokens_per_s": 20.0},
            "c4": {"output_tokens_per_s": 0.0}}
    assert vs_llama_cpp(fleet, peer) == {"vs_llama_cpp_c1": 0.5, "vs_llama_cpp_c8": pytest.approx(0.9),
                                         "vs_llama_cpp_c4": None}
    assert vs_llama_cpp(fleet, {"c1": {"output_tokens_per_s": 1.5}}) == {"vs_llama_cpp_c1": 2.0}


def test_greedy_ids_are_compared_level_by_level():
    fleet = {"c1": [(1, 2, 3)], "c2": [(4, 5, 6), (7, 8, 9)]}
    peer = {"c1": [(1, 2, 3)], "c2": [(4, 5, 0), (7, 8, 9)]}
    agreement = greedy_vs_llama_cpp(fleet, peer)
    assert agreement["c1"]["identical_streams"] == 1
    assert (agreement["c2"]["identical_streams"], agreement["c2"]["agreeing_prefix_tokens"]) == (1, 5)
    assert agreement["c2"]["fornax_setup"] == "fleet route"


def test_the_peer_report_holds_figures_ratios_agreement_and_provenance():
    fleet = {"c1": {"output_tokens_per_s": 4.0}}
    peer = {"c1": {"output_tokens_per_s": 8.0, "ttft_p50_s": 0.1}}
    report = peer_report(fleet, peer, {"c1": [(1, 2)]}, {"c1": [(1, 3)]}, "llama-server X")
    assert report["vs_llama_cpp_c1"] == 0.5
    assert report["llama_cpp"] == peer
    assert report["greedy_vs_llama_cpp"]["c1"]["agreeing_prefix_tokens"] == 1
    assert report["peer_provenance"] == "llama-server X"
