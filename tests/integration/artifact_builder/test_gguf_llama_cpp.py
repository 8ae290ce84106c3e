"""GGUFs made by llama.cpp's own tools from a generated tiny checkpoint, built and served.

Needs FORNAX_LLAMA_CPP_DIR (a llama.cpp source tree: its `convert_hf_to_gguf.py`) and, for the
quantized files, FORNAX_LLAMA_QUANTIZE (a built `llama-quantize`); `scripts/build_llama_quantize.sh`
makes both and prints the exports. Without them these tests are skipped.

- The converter's f32 file computes exactly the checkpoint's logits.
- `llama-quantize` Q8_0 and Q4_K_M files (with its fallbacks: tiny's rows fit no 256-block) keep
  every type they store, compute exactly the logits of their own dequantized weights on a 2-stage
  route, and a 2-stage numpy fleet serves, through the `openai` client, the greedy text of
  transformers run on those dequantized weights.
- The Q4_K_M file serves on a 2-stage MAX fleet (graph variants from the file's formats, compiled
  as the stages load): its next token, teacher forced along the numpy reference's greedy
  continuation, agrees with that reference's at >= 0.95 of positions; `fornax parity` on the file
  gates the same way and prints its evidence.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest

from apps.bench.gguf_convert import convert
from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.gguf_source import read_gguf
from libs.text.context import TextContext
from libs.text.tokenizer import ProjectTokenizer
from tests.integration.orchestrator.test_fleet_serving import wait_route_ready
from tests.support.dequantized_reference import reference_greedy_under_policy
from tests.support.gguf_files import dequantized_from_gguf, write_reference_checkpoint
from tests.unit.artifact_builder.test_gguf_source import TEXTS, _two_stage_logits, build
from tests.unit.artifact_builder.test_weight_policies import _logits

pytestmark = pytest.mark.integration
LLAMA_CPP = os.environ.get("FORNAX_LLAMA_CPP_DIR")
QUANTIZE = os.environ.get("FORNAX_LLAMA_QUANTIZE")
needs_converter = pytest.mark.skipif(not LLAMA_CPP, reason="FORNAX_LLAMA_CPP_DIR not set")
needs_quantize = pytest.mark.skipif(not (LLAMA_CPP and QUANTIZE), reason="FORNAX_LLAMA_QUANTIZE not set")
NEW_TOKENS = 10
PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12]]
# What llama-quantize wrote for tiny (hidden 64: no row fits a 256-block, so every K-quant fell back).
EXPECTED_TYPES = {"Q8_0": {"F32", "F16", "Q8_0"}, "Q4_K_M": {"F32", "F16", "Q8_0", "Q5_0", "Q5_1"}}


@pytest.fixture(scope="module")
def tiny_f32_gguf(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gguf")
    write_checkpoint(CheckpointRequest("tiny", root / "tiny", seed=0))
    return root / "tiny", convert(Path(str(LLAMA_CPP)), root / "tiny", root / "tiny-f32.gguf")


def _quantized(tiny_f32_gguf, preset: str) -> Path:
    checkpoint, f32 = tiny_f32_gguf
    out = f32.with_name(f"tiny-{preset}.gguf")
    if not out.exists():
        subprocess.run(["nice", "-n", "10", str(QUANTIZE), str(f32), str(out), preset, "1"],
                       check=True, capture_output=True, timeout=300)
    return out


@needs_converter
def test_the_converters_f32_file_computes_exactly_the_checkpoints_logits(tiny_f32_gguf, tmp_path):
    checkpoint, gguf = tiny_f32_gguf
    _, stored = read_gguf(str(gguf))
    assert any(t.name.endswith("attn_k_b.weight") for t in stored)  # the current split kv_b layout
    assert any(t.name.endswith("ffn_up_exps.weight") for t in stored)  # merged experts
    inspection, (stage,) = build(gguf, tmp_path / "out")
    cfg = load_config(stage.artifact_dir)
    assert cfg == load_config(checkpoint)
    ours = ProjectTokenizer.from_file(stage.artifact_dir / "tokenizer.json", inspection.snapshot.tokenizer_sha256)
    original = ProjectTokenizer.from_file(checkpoint / "tokenizer.json")
    assert [ours.encode(t) for t in TEXTS] == [original.encode(t) for t in TEXTS]
    np.testing.assert_array_equal(_logits(stage.artifact_dir, cfg)[0], _logits(checkpoint, cfg)[0])


@needs_quantize
@pytest.mark.parametrize("preset", ["Q8_0", "Q4_K_M"])
def test_llama_quantize_files_keep_their_types_and_compute_their_dequantized_reference(
        tiny_f32_gguf, tmp_path, preset):
    checkpoint, _ = tiny_f32_gguf
    gguf = _quantized(tiny_f32_gguf, preset)
    _, stored = read_gguf(str(gguf))
    assert {t.gguf_type for t in stored} == EXPECTED_TYPES[preset]
    inspection, stages = build(gguf, tmp_path / "out", stages=2)
    formats = {t.name: t.weight_format for s in stages for t in s.manifest.tensors}
    kept = [f for n, f in formats.items() if "kv_b_proj" not in n]
    assert all(f.quantizer == "source bytes" and f.format == f.wanted for f in kept)
    assert {f.source_dtype for f in kept} >= EXPECTED_TYPES[preset] - {"F16"}
    cfg = load_config(stages[0].artifact_dir)
    reference = write_reference_checkpoint(checkpoint, dequantized_from_gguf(gguf), tmp_path / "dequantized")
    np.testing.assert_array_equal(_two_stage_logits(stages, cfg), _logits(reference, cfg)[0])


@needs_quantize
@pytest.mark.slow
def test_a_fleet_serves_a_llama_quantize_q4_k_m_file_as_its_reference(tiny_f32_gguf, tmp_path):
    checkpoint, _ = tiny_f32_gguf
    gguf = _quantized(tiny_f32_gguf, "Q4_K_M")
    options = FleetOptions(state_dir=tmp_path / ".fornax", stages=2, backend="numpy", boundary_dtype="fp32",
                           checkpoint=str(gguf), startup_timeout_s=180)
    state, launcher = start_fleet(options)
    try:
        wait_route_ready(state.api)

        async def main():
            api = openai.AsyncOpenAI(base_url=state.api, api_key="none", max_retries=0)
            model = (await api.models.list()).data[0]
            completions = await asyncio.gather(*(api.completions.create(
                model=model.id, prompt=p, max_tokens=NEW_TOKENS, temperature=0) for p in PROMPTS))
            return model, completions

        model, served = asyncio.run(main())
    finally:
        launcher.stop_all()
    reference = write_reference_checkpoint(checkpoint, dequantized_from_gguf(gguf), tmp_path / "dequantized")
    expected = reference_greedy_under_policy(reference, "fp32", PROMPTS, NEW_TOKENS)
    tokenizer = TextContext.from_checkpoint(checkpoint).tokenizer
    assert [c.choices[0].text for c in served] == [tokenizer.decode(e) for e in expected]
    execution = model.model_extra["fornax"]["execution"]
    assert execution["stage_weights"] == ["gguf", "gguf"]
    # tiny's 4 layers, 2 per stage: each stage says its kv_b_proj were reassembled, and nothing else
    assert [len(c) for c in execution["stage_conversions"]] == [1, 1]
    assert all(c[0].startswith("2 tensors F32 wanted fp32, held fp32") and "attn_k_b" in c[0]
               for c in execution["stage_conversions"])


MAX_READY_TIMEOUT_S = 1800  # cold MAX compiles of every graph variant, on a 2-core box
GGUF_MAX_TOP1_MIN = 0.95


def _wait_ready(api: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    health = api.removesuffix("/v1") + "/health"
    while True:
        try:
            with urllib.request.urlopen(health, timeout=10):
                return
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(1.0)


def _next_tokens(api_url: str, prompts: list[list[int]]) -> tuple[dict, list[str]]:
    """(the model entry, each prompt's greedy next token as text), one request per prompt."""

    async def main():
        api = openai.AsyncOpenAI(base_url=api_url, api_key="none", max_retries=0, timeout=600)
        model = (await api.models.list()).data[0]
        replies = await asyncio.gather(*(api.completions.create(
            model=model.id, prompt=p, max_tokens=1, temperature=0) for p in prompts))
        return model, [r.choices[0].text for r in replies]

    return asyncio.run(main())


@needs_quantize
@pytest.mark.slow
def test_a_max_fleet_serves_a_llama_quantize_q4_k_m_file_agreeing_with_its_numpy_reference(
        tiny_f32_gguf, tmp_path):
    pytest.importorskip("max")
    checkpoint, _ = tiny_f32_gguf
    gguf = _quantized(tiny_f32_gguf, "Q4_K_M")
    reference = write_reference_checkpoint(checkpoint, dequantized_from_gguf(gguf), tmp_path / "dequantized")
    # transformers on the file's dequantized weights: the numpy route's greedy ids exactly (above)
    expected = reference_greedy_under_policy(reference, "fp32", PROMPTS, NEW_TOKENS)
    forced = [p + e[:k] for p, e in zip(PROMPTS, expected, strict=True) for k in range(NEW_TOKENS)]
    options = FleetOptions(state_dir=tmp_path / ".fornax", stages=2, backend="max", boundary_dtype="fp32",
                           checkpoint=str(gguf), serve_while_compiling=False, startup_timeout_s=180)
    state, launcher = start_fleet(options)
    try:
        _wait_ready(state.api, MAX_READY_TIMEOUT_S)
        model, served = _next_tokens(state.api, forced)
    finally:
        launcher.stop_all()
    tokenizer = TextContext.from_checkpoint(checkpoint).tokenizer
    wanted = [tokenizer.decode([e[k]]) for e in expected for k in range(NEW_TOKENS)]
    agreement = sum(a == b for a, b in zip(served, wanted, strict=True)) / len(wanted)
    assert agreement >= GGUF_MAX_TOP1_MIN, (agreement, served, wanted)
    execution = model.model_extra["fornax"]["execution"]
    assert execution["stage_weights"] == ["gguf", "gguf"]
    # the file's Q5_0, Q5_1 and Q8_0 products (llama.cpp's fallbacks for rows no 256-block fits)
    # run as stored, through the Mojo op: no stage converts them (only the embeddings, which MAX
    # reads by a gather, are held in bf16)
    _, stored = read_gguf(str(gguf))
    assert {"Q5_0", "Q8_0"} <= {t.gguf_type for t in stored}
    lines = [line for c in execution["stage_conversions"] for line in c]
    converted = [line for line in lines if re.search(r"\d+ tensors? (Q5_0|Q5_1|Q8_0) wanted", line)]
    assert all(line.startswith("1 tensor ") and "model.embed_tokens.weight" in line for line in converted), lines
    print(f"gguf Q4_K_M on a 2-stage MAX fleet: top-1 {agreement:.3f} over {len(wanted)} positions")


@needs_quantize
@pytest.mark.slow
def test_fornax_parity_gates_a_q4_k_m_file_on_max_against_its_own_weights(tiny_f32_gguf, capsys):
    pytest.importorskip("max")
    from apps.cli.main import main

    gguf = _quantized(tiny_f32_gguf, "Q4_K_M")
    code = main(["parity", "--checkpoint", str(gguf), "--backend", "max", "--stages", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASS (top-1 >= 0.95)" in out
    agreement = float(out.split("top-1 agreement with the reference: ")[1].split()[0])
    assert agreement >= GGUF_MAX_TOP1_MIN
    assert "evidence: physical; CPU " in out and "snapshot " in out and "fornax parity" in out
