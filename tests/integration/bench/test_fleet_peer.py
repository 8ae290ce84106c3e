"""`fornax bench serve --fleet --peer llama.cpp`: the fleet's stream driver and the peer run after
the fleet, against the stand-in `llama-server` (tests/support/fake_llama_server.py), which speaks
the same `/v1/completions` streaming the fleet's API does. With FORNAX_LLAMA_SERVER (a built
`llama-server`, `scripts/build_llama_quantize.sh --server`) and FORNAX_LLAMA_CPP_DIR, the real
server also serves the tiny preset's GGUF at two levels."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import pytest

from apps.bench import fleet_serve
from apps.bench.fleet_peer import PeerRun, peer_report, run_peer
from apps.bench.llama_peer import LlamaPeerOptions, LlamaServer

pytestmark = pytest.mark.integration

FAKE = Path(__file__).resolve().parents[2] / "support" / "fake_llama_server.py"
LLAMA_CPP = os.environ.get("FORNAX_LLAMA_CPP_DIR")
LLAMA_SERVER = os.environ.get("FORNAX_LLAMA_SERVER")


@pytest.fixture
def fake_peer(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    return str(server), str(gguf)


def test_the_fleet_driver_asks_for_exactly_max_tokens_and_counts_the_usage(fake_peer):
    # The stand-in streams max_tokens chunks only when ignore_eos is set (else one).
    batch = [tuple(range(100 + i, 116 + i)) for i in range(3)]
    with LlamaServer(LlamaPeerOptions(*fake_peer, slots=3, startup_timeout_s=60)) as peer:
        figures = asyncio.run(fleet_serve._drive(f"{peer.base_url}/v1", batch, 5))
    assert figures.output_tokens == 15 and len(figures.ttft_s) == 3 and len(figures.itl_s) == 12


def test_the_peer_runs_every_level_and_compares_greedy_ids_with_the_fleets(fake_peer):
    run = PeerRun(LlamaPeerOptions(*fake_peer, slots=4, startup_timeout_s=60), vocab=1000, prompt_tokens=8,
                  max_tokens=3, concurrency=(1, 4))
    levels, ids = run_peer(run, tuple(sorted(os.sched_getaffinity(0))))
    assert set(levels) == {"c1", "c4"} and levels["c4"]["output_tokens"] == 12
    assert [len(v) for v in ids.values()] == [1, 4]
    fleet_ids = {"c1": ids["c1"], "c4": [ids["c4"][0], (0, 0, 0), *ids["c4"][2:]]}
    fleet_levels = {level: {"output_tokens_per_s": figures["output_tokens_per_s"] / 2}
                    for level, figures in levels.items()}
    report = peer_report(fleet_levels, levels, fleet_ids, ids, "stand-in")
    assert report["vs_llama_cpp_c1"] == pytest.approx(0.5) and report["vs_llama_cpp_c4"] == pytest.approx(0.5)
    assert report["greedy_vs_llama_cpp"]["c4"]["identical_streams"] == 3


@pytest.mark.skipif(not (LLAMA_SERVER and LLAMA_CPP),
                    reason="FORNAX_LLAMA_SERVER and FORNAX_LLAMA_CPP_DIR not set "
                           "(scripts/build_llama_quantize.sh --server prints them)")
def test_the_real_llama_server_serves_the_peer_levels(tmp_path):
    from apps.bench.gguf_convert import convert
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

    write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny", seed=0))
    gguf = convert(Path(str(LLAMA_CPP)), tmp_path / "tiny", tmp_path / "tiny-f32.gguf")
    run = PeerRun(LlamaPeerOptions(str(LLAMA_SERVER), str(gguf), slots=2, context_per_slot=64, threads=1),
                  vocab=512, prompt_tokens=8, max_tokens=4, concurrency=(1, 2))
    levels, ids = run_peer(run, tuple(sorted(os.sched_getaffinity(0)))[:1])
    assert levels["c2"]["output_tokens"] == 8 and levels["c1"]["output_tokens_per_s"] > 0
    assert [len(stream) for stream in ids["c2"]] == [4, 4]


def test_a_peer_that_fails_after_the_fleet_keeps_the_fleets_figures_and_states_the_failure(tmp_path, fake_peer):
    from apps.bench.fleet_serve import FleetBenchOptions, _peer
    from apps.fleet.spec import load_fleet_spec
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

    write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny", seed=0))
    dying = tmp_path / "dying-server"
    dying.write_text("#!/bin/sh\necho 'failed to load model' >&2\nexit 3\n")
    dying.chmod(dying.stat().st_mode | stat.S_IXUSR)
    spec = load_fleet_spec(Path(__file__).resolve().parents[3] / "fleets" / "two-hosts-core-each.yaml")
    options = FleetBenchOptions("f.yaml", spec, str(tmp_path / "tiny"), concurrency=(1,),
                                llama=LlamaPeerOptions(str(dying), fake_peer[1], slots=1, startup_timeout_s=30))
    part = _peer(options, {"c1": {"output_tokens_per_s": 5.0}}, {"c1": [(1, 2)]})
    assert part["llama_cpp"] is None and part["peer_error"]["reason"] == "PEER_EXITED"
    assert "failed to load model" in part["peer_error"]["message"] and "dying-server" in part["peer_provenance"]
