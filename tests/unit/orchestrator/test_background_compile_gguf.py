"""A background compile for MAX stages serving a GGUF counts the graph variants of the file's
stored formats as its stages will bind them: cached only when every one of them is."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.compile_cache import GraphTarget, config_sha256, record_compiled
from libs.model.config import load_config
from libs.model.graph_variants import checkpoint_graph_variants
from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings, GraphState
from tests.support.gguf_files import write_gguf

BUILD = "max test-build"
RANGES = ((0, 2), (2, 4))


def _q4_0_projections(name: str, shape: tuple[int, ...]) -> str:
    """Q4_0 (MAX runs it) wherever a row fits its 32-block, else what tiny's llama.cpp file holds."""
    if len(shape) == 1 or "ffn_gate_inp" in name:
        return "F32"
    return "Q4_0" if shape[-1] % 32 == 0 else "F16"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bg_gguf")
    checkpoint = write_checkpoint(CheckpointRequest("tiny", root / "tiny", seed=0)).out_dir
    path = root / "tiny-q4_0.gguf"
    write_gguf(checkpoint, path, _q4_0_projections)
    return path


def _mark(cache: Path, gguf: Path, quantized: bool) -> None:
    cfg = load_config(gguf)
    variants = checkpoint_graph_variants(gguf, cfg, "fp32")
    assert variants is not None
    config_hash = config_sha256(cfg)
    for name, quants in variants.quant.items():
        for quant in quants if quantized else ((),):
            record_compiled(cache, GraphTarget(name, BUILD, "cpu", variants.weight_dtype, config_hash, quant), 1.0)


def test_a_ggufs_variants_are_what_the_background_compile_waits_for(gguf, tmp_path):
    settings = CompileSettings(str(gguf), tmp_path / "cache", BUILD)
    assert {g.state for g in BackgroundCompiler(settings, RANGES).graphs.values()} == {GraphState.QUEUED}
    _mark(settings.cache_dir, gguf, quantized=False)  # the unquantized graphs are not the file's
    assert not BackgroundCompiler(settings, RANGES).all_cached()
    _mark(settings.cache_dir, gguf, quantized=True)
    assert BackgroundCompiler(settings, RANGES).all_cached()
