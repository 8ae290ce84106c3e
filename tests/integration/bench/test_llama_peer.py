"""`fornax bench serve --peer llama.cpp`: the peer process, its driver and the ratios, against a
stand-in `llama-server` that really serves HTTP (tests/support/fake_llama_server.py)."""

from __future__ import annotations

import asyncio
import stat
import sys
from pathlib import Path

import pytest

from apps.bench import serve
from apps.bench.llama_peer import (
    LlamaPeerOptions,
    LlamaServer,
    PeerError,
    check_options,
    drive,
    greedy_agreement,
    greedy_token_ids,
)
from apps.cli.main import main

pytestmark = pytest.mark.integration

FAKE = Path(__file__).resolve().parents[2] / "support" / "fake_llama_server.py"


def _executable(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def peer_files(tmp_path):
    server = _executable(tmp_path / "llama-server", f'exec "{sys.executable}" "{FAKE}" "$@"')
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    return server, str(gguf)


def test_the_peer_streams_exactly_the_asked_tokens_for_every_prompt(peer_files):
    server, gguf = peer_files
    batch = [tuple(range(100 + i, 132 + i)) for i in range(4)]
    with LlamaServer(LlamaPeerOptions(server, gguf, slots=4, startup_timeout_s=60)) as peer:
        figures, texts = asyncio.run(drive(peer.base_url, batch, 5))
    assert figures.output_tokens == 20 and len(figures.ttft_s) == 4 and len(figures.itl_s) == 16
    assert texts[1] == " t101 t102 t103 t104 t105"  # each prompt's own stream, in order
    assert figures.summary()["output_tokens_per_s"] > 0


def test_a_repeated_level_is_prefilled_again_not_served_from_the_prompt_cache(peer_files):
    # The stand-in, like llama-server, answers a repeated prompt from its cache unless the
    # request turns that off; a second repeat of the same level must not be.
    server, gguf = peer_files
    batch = [tuple(range(100 + i, 132 + i)) for i in range(3)]
    with LlamaServer(LlamaPeerOptions(server, gguf, slots=3, startup_timeout_s=60)) as peer:
        first, _ = asyncio.run(drive(peer.base_url, batch, 3))
        second, _ = asyncio.run(drive(peer.base_url, batch, 3))
    assert first.output_tokens == second.output_tokens == 9


def test_a_peer_that_serves_prompts_from_its_cache_anyway_fails_the_run(tmp_path, peer_files):
    _, gguf = peer_files
    server = _executable(tmp_path / "caching-server", f'exec "{sys.executable}" "{FAKE}" --always-cache "$@"')
    batch = [tuple(range(100 + i, 132 + i)) for i in range(2)]
    with LlamaServer(LlamaPeerOptions(server, gguf, slots=2, startup_timeout_s=60)) as peer:
        asyncio.run(drive(peer.base_url, batch, 3))  # first sight of each prompt: nothing cached
        with pytest.raises(PeerError) as caught:
            asyncio.run(drive(peer.base_url, batch, 3))
    assert caught.value.reason == "PEER_PROMPT_CACHE" and "31 cached prompt tokens of 32" in str(caught.value)


def test_the_peer_gives_each_prompts_greedy_token_ids(peer_files):
    server, gguf = peer_files
    batch = [tuple(range(100 + i, 132 + i)) for i in range(3)]
    with LlamaServer(LlamaPeerOptions(server, gguf, slots=3, startup_timeout_s=60)) as peer:
        ids = asyncio.run(greedy_token_ids(peer.base_url, batch, 4))
    assert ids == [(100, 101, 102, 103), (101, 102, 103, 104), (102, 103, 104, 105)]


def test_a_peer_whose_greedy_streams_differ_is_reported_as_disagreeing(tmp_path, peer_files):
    _, gguf = peer_files
    server = _executable(tmp_path / "diverging-server", f'exec "{sys.executable}" "{FAKE}" --diverge-after 2 "$@"')
    batch = [tuple(range(100 + i, 132 + i)) for i in range(3)]
    ours = [tuple(range(p[0], p[0] + 4)) for p in batch]
    with LlamaServer(LlamaPeerOptions(server, gguf, slots=3, startup_timeout_s=60)) as peer:
        theirs = asyncio.run(greedy_token_ids(peer.base_url, batch, 4))
    agreement = greedy_agreement(ours, theirs)
    assert agreement["identical_streams"] == 0 and agreement["agreeing_prefix_tokens"] == 3 * 2


def test_a_peer_that_exits_at_start_is_reported_with_its_log(tmp_path, peer_files):
    _, gguf = peer_files
    dying = _executable(tmp_path / "dying-server", "echo 'no such option' >&2; exit 3")
    with pytest.raises(PeerError) as caught:
        LlamaServer(LlamaPeerOptions(dying, gguf, startup_timeout_s=30))
    assert caught.value.reason == "PEER_EXITED" and "no such option" in str(caught.value)


@pytest.mark.parametrize("bad,reason", [("binary", "PEER_BINARY_MISSING"), ("model", "PEER_MODEL_MISSING"),
                                        ("magic", "PEER_MODEL_NOT_GGUF")])
def test_unusable_peer_files_are_refused_before_anything_runs(tmp_path, peer_files, bad, reason):
    server, gguf = peer_files
    if bad == "binary":
        server = str(tmp_path / "absent")
    elif bad == "model":
        gguf = str(tmp_path / "absent.gguf")
    else:
        Path(gguf).write_bytes(b"PK\x03\x04")
    with pytest.raises(PeerError) as caught:
        check_options(LlamaPeerOptions(server, gguf))
    assert caught.value.reason == reason


@pytest.mark.parametrize("argv,reason", [(["--peer", "llama.cpp"], "PEER_ARGS_MISSING"),
                                         (["--gguf", "x.gguf"], "PEER_ARGS_WITHOUT_PEER")])
def test_serve_refuses_incomplete_peer_arguments(argv, reason, capsys):
    assert main(["bench", "serve", *argv]) == 2
    assert reason in capsys.readouterr().err


def test_the_report_carries_one_stage_and_llama_cpp_ratios(monkeypatch, peer_files):
    def level(tok_s):
        return {"output_tokens_per_s": tok_s}

    fake = {"pipeline_2_stage": {"c32": level(60.0)}, "pipeline_1_stage": {"c32": level(90.0)},
            "transformers": {"c32": level(60.0)}, "llama_cpp": {"c32": level(120.0)}}
    monkeypatch.setattr(serve, "measure", lambda options: fake)
    monkeypatch.setattr(serve, "provenance", lambda options, command: {})
    options = serve.BenchOptions("unused", concurrency=(32,), llama=LlamaPeerOptions(*peer_files))
    report = serve.run(options, "fornax bench serve")
    assert report["one_stage_vs_transformers_c32"] == pytest.approx(1.5)
    assert report["vs_llama_cpp_c32"] == pytest.approx(0.75)
    assert report["two_vs_one_stage_c32"] == pytest.approx(60 / 90)
