"""The layer-streamed reference equals transformers' whole model on the same weights: float32
from a checkpoint, and a policy's built stage artifacts decoded to float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from libs.common.kinds import DType
from libs.model.config import load_config
from libs.model.streamed_reference import (
    ReferenceSourceError,
    artifact_source,
    checkpoint_source,
    streamed_logits,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTHS = (7, 12, 1)
# Same modules and float32 weights; only the routed experts' summation order differs (eager
# loop here, grouped_mm in from_pretrained's model): float32 rounding, about 1e-5 on |logits| ~ 30.
TOLERANCE = 1e-4
# A policy's weights move the logits far more than rounding does.
QUANTIZED_MIN_DIFF = 1e-2


def _sequences(checkpoint: Path, seed: int = 0) -> list[list[int]]:
    vocab = load_config(checkpoint).vocab_size
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in LENGTHS]


def _whole_model(checkpoint: Path, stage_dirs: tuple[Path, ...] = ()):
    """Transformers' whole model, from the checkpoint; with `stage_dirs`, every stage's weights
    as its artifact stores them, decoded to float32 (the path `fornax parity --weights` uses)."""
    from libs.model.bench_transformers import load_policy_weights
    from libs.model.weights import load_stage_weights

    cfg = load_config(checkpoint)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    for source in artifact_source(stage_dirs).ranges if stage_dirs else ():
        start, end, path = source
        weights = load_stage_weights(path, cfg, start, end, start == 0, end == cfg.num_hidden_layers)
        load_policy_weights(model, cfg, weights)
    return model


def _whole_logits(model, sequences: list[list[int]]) -> list[np.ndarray]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([ids])).logits[0].numpy() for ids in sequences]


def _build(checkpoint: Path, out: Path, policy: str, backend: str) -> tuple[Path, ...]:
    from services.artifact_builder.build import BuildOptions, BuildResult, build_stage_artifacts
    from services.artifact_builder.snapshot import inspect_checkpoint
    from services.artifact_builder.staging import even_layer_ranges, plan_from_ranges

    layers = load_config(checkpoint).num_hidden_layers
    plan = plan_from_ranges(even_layer_ranges(layers, 2))
    options = BuildOptions(out, DType.FP32, weights_policy=policy, stage_backends=(backend, backend))
    result = [e for e in build_stage_artifacts(inspect_checkpoint(checkpoint), plan, options)
              if isinstance(e, BuildResult)][-1]
    return tuple(stage.artifact_dir for stage in result.stages)


@pytest.mark.parametrize("checkpoint", ["tiny_checkpoint", "variant_checkpoint"])
def test_streamed_logits_equal_the_whole_model_in_float32(checkpoint, request):
    path = request.getfixturevalue(checkpoint)
    sequences = _sequences(path)
    streamed = streamed_logits(checkpoint_source(path), sequences, keep_logits=True)
    expected = _whole_logits(_whole_model(path), sequences)
    assert streamed.logits is not None
    for ours, ref, top1 in zip(streamed.logits, expected, streamed.top1, strict=True):
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=0, atol=TOLERANCE)
        np.testing.assert_array_equal(top1, ref.argmax(-1))
    assert "DeepseekV2DecoderLayer one layer at a time" in streamed.reference
    assert streamed.largest_layer_f32_bytes > 0 and streamed.peak_rss_bytes >= streamed.baseline_rss_bytes


@pytest.mark.parametrize(("checkpoint", "policy", "backend"), [
    ("tiny_checkpoint", "q4_k_m", "numpy"),
    ("variant_checkpoint", "q8_0", "numpy"),
    ("tiny_checkpoint", "q4_k_m", "max"),  # a build for MAX: bf16 embeddings and kv_b_proj, recorded conversions
])
def test_streamed_logits_of_built_artifacts_equal_the_whole_model_on_their_decoded_weights(
        checkpoint, policy, backend, request, tmp_path):
    path = request.getfixturevalue(checkpoint)
    stage_dirs = _build(path, tmp_path / "out", policy, backend)
    sequences = _sequences(path, seed=1)
    streamed = streamed_logits(artifact_source(stage_dirs), sequences, keep_logits=True)
    expected = _whole_logits(_whole_model(path, stage_dirs), sequences)
    source = _whole_logits(_whole_model(path), sequences)
    assert streamed.logits is not None
    for ours, ref, unquantized in zip(streamed.logits, expected, source, strict=True):
        np.testing.assert_allclose(ours, ref, rtol=0, atol=TOLERANCE)
        np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))
        # the artifacts' weights are not the checkpoint's: the check can tell them apart
        assert np.abs(ours - unquantized).max() > QUANTIZED_MIN_DIFF
    assert "2 stage artifacts" in streamed.reference


def test_the_checkpoint_with_a_policy_is_the_same_model_as_its_build(tiny_checkpoint, tmp_path):
    stage_dirs = _build(tiny_checkpoint, tmp_path / "out", "q4_k_m", "numpy")
    sequences = _sequences(tiny_checkpoint, seed=2)
    built = streamed_logits(artifact_source(stage_dirs), sequences, keep_logits=True)
    encoded = streamed_logits(checkpoint_source(tiny_checkpoint, "q4_k_m"), sequences, keep_logits=True)
    assert built.logits is not None and encoded.logits is not None
    for a, b in zip(built.logits, encoded.logits, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_incomplete_artifact_set_and_bad_ids_are_refused(tiny_checkpoint, tmp_path):
    stage_dirs = _build(tiny_checkpoint, tmp_path / "out", "fp32", "numpy")
    with pytest.raises(ReferenceSourceError) as missing:
        artifact_source(stage_dirs[1:])
    assert missing.value.reason == "REFERENCE_SOURCE_INCOMPLETE"
    with pytest.raises(ReferenceSourceError) as twice:
        artifact_source((stage_dirs[0], stage_dirs[0], stage_dirs[1]))
    assert twice.value.reason == "REFERENCE_SOURCE_INCOMPLETE"
    vocab = load_config(tiny_checkpoint).vocab_size
    for bad in ([], [0, vocab]):
        with pytest.raises(ReferenceSourceError) as invalid:
            streamed_logits(checkpoint_source(tiny_checkpoint), [[1, 2], bad])
        assert invalid.value.reason == "REFERENCE_SEQUENCE_INVALID"


def test_hidden_states_after_a_layer_the_model_lacks_are_refused(tiny_checkpoint):
    layers = load_config(tiny_checkpoint).num_hidden_layers
    with pytest.raises(ReferenceSourceError, match=f"outside \\[0, {layers}\\)"):
        streamed_logits(checkpoint_source(tiny_checkpoint), [[1, 2]], hidden_after=[layers])
