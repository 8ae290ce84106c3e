"""llama.cpp's real converter and server on a generated checkpoint, when this host has them:
FORNAX_LLAMA_CPP_DIR (a llama.cpp source tree, README "llama.cpp as a peer") and, for the server
test, FORNAX_LLAMA_SERVER (a built `llama-server`). Without them these tests are skipped."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from apps.bench.gguf_convert import convert
from apps.bench.llama_peer import LlamaPeerOptions, LlamaServer, greedy_token_ids
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

pytestmark = pytest.mark.integration

LLAMA_CPP = os.environ.get("FORNAX_LLAMA_CPP_DIR")
LLAMA_SERVER = os.environ.get("FORNAX_LLAMA_SERVER")
needs_converter = pytest.mark.skipif(not LLAMA_CPP, reason="FORNAX_LLAMA_CPP_DIR not set")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf")
    write_checkpoint(CheckpointRequest("tiny", root / "tiny", seed=0))
    return convert(Path(str(LLAMA_CPP)), root / "tiny", root / "tiny-f32.gguf")


@needs_converter
def test_the_converter_keeps_every_token_and_names_the_gpt2_pre_tokenizer(tiny_gguf):
    sys.path.insert(0, str(Path(str(LLAMA_CPP)) / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    fields = GGUFReader(str(tiny_gguf)).fields
    assert fields["general.architecture"].contents() == "deepseek2"
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert len(fields["tokenizer.ggml.tokens"].data) == 512  # the tiny preset's vocabulary
    assert fields["deepseek2.attention.q_lora_rank"].contents() == 0  # the preset has no query LoRA


@needs_converter
@pytest.mark.skipif(not LLAMA_SERVER, reason="FORNAX_LLAMA_SERVER not set")
def test_the_real_server_gives_greedy_token_ids_for_token_id_prompts(tiny_gguf):
    batch = [tuple(range(10 + i, 42 + i)) for i in range(2)]
    with LlamaServer(LlamaPeerOptions(str(LLAMA_SERVER), str(tiny_gguf), slots=2, threads=1,
                                      startup_timeout_s=120)) as peer:
        ids = asyncio.run(greedy_token_ids(peer.base_url, batch, 6))
        again = asyncio.run(greedy_token_ids(peer.base_url, batch, 6))
    assert [len(s) for s in ids] == [6, 6] and all(0 <= t < 512 for s in ids for t in s)
    assert ids == again  # greedy: the same continuation every time
