"""`fornax artifacts` end to end, and the build's peak memory on the `small` preset."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

pytestmark = pytest.mark.integration

# Runs COMMAND as its only child and prints that child's peak RSS in KiB (Linux ru_maxrss).
_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n"
)


def _fornax(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], capture_output=True, text=True, timeout=300)


def _peak_rss_bytes(*args: str) -> int:
    done = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "apps.cli.main", *args],
                          capture_output=True, text=True, timeout=600, check=True)
    rss_kib, rc = (int(x) for x in done.stdout.split())
    assert rc == 0, done.stderr
    return rss_kib * 1024


def test_cli_build_verify_inspect_and_tamper(tmp_path):
    checkpoint = tmp_path / "ck"
    write_checkpoint(CheckpointRequest("tiny-lora-yarn", checkpoint, max_shard_bytes=200_000))
    out = tmp_path / "out"
    built = _fornax("artifacts", "build", "--checkpoint", str(checkpoint), "--stages", "2", "--out", str(out),
                    "--boundary-dtype", "bf16", "--source", "generated:tiny-lora-yarn", "--json")
    assert built.returncode == 0, built.stderr
    result = json.loads(built.stdout)
    assert [s["stage_index"] for s in result["stages"]] == [0, 1]
    # The manifest's name for a range's end, as the JSON has always said it.
    first, second = result["stages"]
    assert first["layer_start"] == 0 and first["layer_end_exclusive"] == second["layer_start"] > 0
    assert "layer_end" not in first
    assert "100.0%" in built.stderr  # plain progress lines: stderr is not a terminal here
    assert sorted(p.name for p in (out / "stage-0").iterdir()) == [
        "config.json", "manifest.json", "model.safetensors"]
    # The final stage samples (and masks samples to grammars), so it carries the tokenizer.
    assert sorted(p.name for p in (out / "stage-1").iterdir()) == [
        "config.json", "manifest.json", "model.safetensors", "tokenizer.json"]
    verified = _fornax("artifacts", "verify", str(out))
    assert verified.returncode == 0 and verified.stdout.count("ok ") == 2
    described = _fornax("artifacts", "inspect", str(out / "stage-1"), "--json")
    manifest = json.loads(described.stdout)[0]["manifest"]
    assert manifest["tied_embeddings"] and manifest["tied_copies"] == ["lm_head.weight"]
    assert _fornax("artifacts", "inspect", str(checkpoint)).returncode == 0

    wrong_plan = _fornax("artifacts", "verify", str(out / "stage-0"), "--plan-hash", "sha256:" + "2" * 64)
    assert wrong_plan.returncode == 1 and "ARTIFACT_PLAN_MISMATCH" in wrong_plan.stdout
    weights = out / "stage-0" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-2])
    truncated = _fornax("artifacts", "verify", str(out))
    assert truncated.returncode == 1 and "ARTIFACT_TRUNCATED" in truncated.stdout


def test_cli_refuses_a_malformed_checkpoint(tmp_path):
    checkpoint = tmp_path / "ck"
    write_checkpoint(CheckpointRequest("tiny", checkpoint, max_shard_bytes=200_000))
    next(checkpoint.glob("model-00002-of-*.safetensors")).unlink()
    for args in (("inspect", str(checkpoint)),
                 ("build", "--checkpoint", str(checkpoint), "--stages", "2", "--out", str(tmp_path / "o"))):
        done = _fornax("artifacts", *args)
        assert done.returncode == 1 and "CHECKPOINT_SHARD_MISSING" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fp32", "q4_k_m"])
def test_build_memory_stays_bounded_on_the_small_preset(tmp_path, policy):
    """Peak RSS of a whole build stays far below the checkpoint size (tensors are streamed, and a
    policy's formats are encoded in bounded row chunks)."""
    checkpoint = tmp_path / "small"
    summary = write_checkpoint(CheckpointRequest("small", checkpoint))
    assert summary.total_bytes > 400 * 2**20
    largest_shard = max((checkpoint / f).stat().st_size for f in summary.shard_files)
    baseline = _import_baseline()
    peak = _peak_rss_bytes("artifacts", "build", "--checkpoint", str(checkpoint), "--stages", "2",
                           "--out", str(tmp_path / "out"), "--quiet", "--weights", policy)
    print(f"peak_rss_bytes={peak} import_baseline_bytes={baseline} checkpoint_bytes={summary.total_bytes}")
    # Holding any shard whole (256 MiB here) would break both bounds.
    assert peak < summary.total_bytes / 4, (peak, summary.total_bytes)
    assert peak - baseline < min(64 * 2**20, largest_shard / 2), (peak, baseline, largest_shard)
    assert _fornax("artifacts", "verify", str(tmp_path / "out")).returncode == 0


def _import_baseline() -> int:
    """Peak RSS of a process that imports everything the build imports but copies nothing."""
    script = ("import services.artifact_builder.build, apps.cli.artifact_builder, "
              "services.artifact_builder.convert, apps.cli.main")
    done = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout.split()[0]) * 1024
