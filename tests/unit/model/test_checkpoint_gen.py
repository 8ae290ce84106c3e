"""Generated checkpoints: deterministic bytes, HF layout, bf16 round trip, sharding."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from libs.model.checkpoint_gen import CheckpointRequest, tensor_values, write_checkpoint
from libs.model.config import load_config
from libs.model.layout import expected_tensors
from libs.model.safetensors_io import bf16_bits_to_float32, float32_to_bf16_bits, read_header
from libs.model.tokenizer_build import ASSETS, CORPUS, TOKENIZER_JSON, tokenizer_vocab_size, train_tokenizer_json
from libs.model.weights import INDEX_NAME, checkpoint_shards, read_bf16_aware


def digest_dir(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = write_checkpoint(CheckpointRequest("tiny", tmp_path / "a", seed=7))
    b = write_checkpoint(CheckpointRequest("tiny", tmp_path / "b", seed=7))
    c = write_checkpoint(CheckpointRequest("tiny", tmp_path / "c", seed=8))
    assert digest_dir(a.out_dir) == digest_dir(b.out_dir)
    assert digest_dir(a.out_dir)["model.safetensors"] != digest_dir(c.out_dir)["model.safetensors"]


def test_checkpoint_holds_exactly_the_layout_tensors_in_bf16(tmp_path):
    summary = write_checkpoint(CheckpointRequest("tiny-lora-yarn", tmp_path))
    cfg = load_config(tmp_path)
    entries, _ = read_header(tmp_path / "model.safetensors")
    specs = expected_tensors(cfg)
    assert {n: (e.dtype, e.shape) for n, e in entries.items()} == {n: ("BF16", s.shape) for n, s in specs.items()}
    assert summary.parameter_count == sum(int(np.prod(s.shape)) for s in specs.values())
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV2ForCausalLM"] and raw["model_type"] == "deepseek_v2"
    assert cfg.vocab_size >= tokenizer_vocab_size()
    assert "im_start" in json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"]


def test_sharded_checkpoint_has_index_and_same_values(tmp_path):
    write_checkpoint(CheckpointRequest("tiny", tmp_path / "one"))
    write_checkpoint(CheckpointRequest("tiny", tmp_path / "many", max_shard_bytes=64 * 1024))
    index = json.loads((tmp_path / "many" / INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) > 1
    names = sorted(checkpoint_shards(tmp_path / "one"))
    assert names == sorted(index["weight_map"])
    one, many = read_bf16_aware(tmp_path / "one", names), read_bf16_aware(tmp_path / "many", names)
    assert all(np.array_equal(one[n], many[n]) for n in names)


def test_stored_values_are_bf16_rounding_of_the_generator(tmp_path):
    write_checkpoint(CheckpointRequest("tiny", tmp_path, seed=3))
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    stored = read_bf16_aware(tmp_path, [name])[name]
    exact = tensor_values(3, name, stored.shape)
    np.testing.assert_array_equal(stored, bf16_bits_to_float32(float32_to_bf16_bits(exact)))
    assert np.abs(stored - exact).max() <= np.abs(exact).max() * 2**-8


def test_norm_weights_are_randomised_around_one(tmp_path):
    values = tensor_values(0, "model.layers.0.input_layernorm.weight", (64,))
    assert values.min() >= 0.8 and values.max() <= 1.2 and values.std() > 0.05


def test_bf16_rounding_is_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 0.0], dtype=np.float32)
    assert bf16_bits_to_float32(float32_to_bf16_bits(x)).tolist() == [1.0, 1.0, 1.0 + 2**-6, -2.5, 0.0]


def test_committed_tokenizer_is_reproducible_from_corpus():
    assert train_tokenizer_json(CORPUS.read_text()) + "\n" == (ASSETS / TOKENIZER_JSON).read_text()


def test_cli_writes_checkpoint(tmp_path, capsys):
    import argparse

    from apps.cli import model as cli

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    benches = commands.add_parser("bench").add_subparsers(dest="bench")
    cli.register(commands, benches)
    args = parser.parse_args(["model", "make-test-checkpoint", "--preset", "tiny", "--out", str(tmp_path)])
    assert args.func(args) == 0
    assert (tmp_path / "model.safetensors").exists() and "parameters=" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["model", "make-test-checkpoint", "--preset", "huge", "--out", str(tmp_path)])


def test_large_presets_have_the_intended_size_and_stream_in_bounded_shards():
    from libs.model.checkpoint_gen import DEFAULT_MAX_SHARD_BYTES, plan_shards
    from libs.model.config import parse_config
    from libs.model.presets import preset_config

    lite = parse_config(preset_config("lite", 0, 2))
    assert (lite.hidden_size, lite.num_hidden_layers, lite.n_routed_experts,
            lite.num_experts_per_tok) == (2048, 27, 64, 6)
    assert (lite.n_shared_experts, lite.kv_lora_rank, lite.vocab_size, lite.rope.rope_type) == (2, 512, 102400, "yarn")
    specs = expected_tensors(lite)
    assert 15.5e9 < sum(int(np.prod(s.shape)) for s in specs.values()) < 16e9
    shards = plan_shards(specs, DEFAULT_MAX_SHARD_BYTES)
    largest = max(sum(2 * int(np.prod(specs[n].shape)) for n in shard) for shard in shards)
    assert len(shards) > 20 and largest <= DEFAULT_MAX_SHARD_BYTES
    small = expected_tensors(parse_config(preset_config("small", 0, 2)))
    assert 2.2e8 < sum(int(np.prod(s.shape)) for s in small.values()) < 2.8e8


def test_writer_round_trips_tensors_larger_than_one_conversion_chunk(tmp_path):
    from libs.model.safetensors_io import SafetensorsWriter, read_tensors_float32

    big = np.random.default_rng(0).standard_normal((5, 1 << 20), dtype=np.float32)
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "x.safetensors"
    writer = SafetensorsWriter(path, [("big", "BF16", big.shape), ("small", "F32", small.shape)], {"format": "pt"})
    writer.write("big", big)
    writer.write("small", small)
    writer.close()
    back = read_tensors_float32(path, ["big", "small"])
    np.testing.assert_array_equal(back["big"], bf16_bits_to_float32(float32_to_bf16_bits(big)))
    np.testing.assert_array_equal(back["small"], small)
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as handle:  # the file is valid for the reference reader too
        assert handle.get_tensor("small").tolist() == small.tolist()
        assert handle.get_slice("big").get_shape() == list(big.shape)


def test_a_checkpoint_that_cannot_fit_the_disk_is_refused_before_writing(tmp_path, monkeypatch):
    import shutil

    from libs.model.checkpoint_gen import InsufficientDiskError

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 2**20))
    with pytest.raises(InsufficientDiskError) as refused:
        write_checkpoint(CheckpointRequest("small", tmp_path / "out"))
    assert refused.value.reason == "INSUFFICIENT_DISK" and "10,485,760 bytes free" in refused.value.message
    assert not any((tmp_path / "out").glob("*.safetensors"))
