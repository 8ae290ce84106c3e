"""Every kind of tampering with a built artifact gets its own reason code."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from libs.artifacts import errors
from libs.artifacts.manifest import artifact_dir_name, decode_manifest, encode_manifest, manifest_hash
from libs.artifacts.verify import verify_artifact
from tests.unit.artifact_builder.fixtures import write_checkpoint
from tests.unit.artifact_builder.test_build import build


@pytest.fixture()
def artifact(tmp_path):
    """A private, content-addressed copy of stage 1 of a fresh build."""
    result, _ = build(write_checkpoint(tmp_path / "ck"), tmp_path / "out", stages=2)
    stage = result.stages[1]
    copy = tmp_path / "copy" / stage.artifact_dir.name
    shutil.copytree(stage.artifact_dir, copy)
    return copy, stage.manifest_hash, result.plan_hash


def _reason(path, **expect) -> str:
    with pytest.raises(tuple(errors.ARTIFACT_ERRORS)) as err:
        verify_artifact(path, **expect)
    return err.value.reason


def test_intact_artifact_verifies(artifact):
    path, digest, plan_hash = artifact
    verified = verify_artifact(path, expected_manifest_hash=digest, expected_plan_hash=plan_hash)
    assert verified.manifest_hash == digest and verified.manifest.stage_index == 1


def test_flipped_byte_in_weights(artifact):
    path, digest, _ = artifact
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))
    assert _reason(path, expected_manifest_hash=digest) == "ARTIFACT_CHECKSUM_MISMATCH"


def test_flipped_byte_in_config(artifact):
    path, _, _ = artifact
    config = path / "config.json"
    data = bytearray(config.read_bytes())
    data[3] ^= 0x20
    config.write_bytes(bytes(data))
    assert _reason(path) == "ARTIFACT_CHECKSUM_MISMATCH"


def test_truncated_weights(artifact):
    path, _, _ = artifact
    weights = path / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1)
    assert _reason(path) == "ARTIFACT_TRUNCATED"


def test_grown_weights(artifact):
    path, _, _ = artifact
    with open(path / "model.safetensors", "ab") as fh:
        fh.write(b"\0")
    assert _reason(path) == "ARTIFACT_SIZE_MISMATCH"


def test_edited_manifest_no_longer_matches_its_hash(artifact):
    path, digest, _ = artifact
    document = json.loads((path / "manifest.json").read_text())
    document["weight_bytes"] += 1
    (path / "manifest.json").write_text(json.dumps(document))
    assert _reason(path) == "ARTIFACT_MANIFEST_HASH_MISMATCH"
    renamed = path.parent / "renamed"
    path.rename(renamed)
    assert _reason(renamed, expected_manifest_hash=digest) == "ARTIFACT_MANIFEST_HASH_MISMATCH"


def test_different_plan(artifact):
    path, digest, _ = artifact
    other_plan = "sha256:" + "0" * 64
    assert _reason(path, expected_manifest_hash=digest, expected_plan_hash=other_plan) == "ARTIFACT_PLAN_MISMATCH"


def test_missing_and_unlisted_files(artifact):
    path, _, _ = artifact
    (path / "stray.bin").write_bytes(b"x")
    assert _reason(path) == "ARTIFACT_LAYOUT_MISMATCH"
    (path / "stray.bin").unlink()
    (path / "config.json").unlink()
    assert _reason(path) == "ARTIFACT_FILE_MISSING"


def test_missing_or_garbled_manifest(artifact):
    path, _, _ = artifact
    raw = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(raw[:-40])
    assert _reason(path) == "ARTIFACT_MANIFEST_INVALID"
    document = json.loads(raw)
    document["unexpected"] = 1
    (path / "manifest.json").write_text(json.dumps(document))
    assert _reason(path) == "ARTIFACT_MANIFEST_INVALID"
    (path / "manifest.json").unlink()
    assert _reason(path) == "ARTIFACT_MANIFEST_MISSING"


def test_self_consistent_forged_manifest_is_caught_by_the_header(artifact, tmp_path):
    """A forger who re-hashes the manifest still cannot make it disagree with the file."""
    path, _, _ = artifact
    manifest = decode_manifest((path / "manifest.json").read_bytes())
    first, second = manifest.tensors[0], manifest.tensors[1]
    swapped = (replace(first, name=second.name), replace(second, name=first.name))
    forged = replace(manifest, tensors=swapped + manifest.tensors[2:])
    target = tmp_path / artifact_dir_name(manifest_hash(forged))
    shutil.copytree(path, target)
    (target / "manifest.json").write_bytes(encode_manifest(forged))
    assert _reason(target) == "ARTIFACT_LAYOUT_MISMATCH"


def test_symlinked_stage_dir_is_checked_against_its_target_name(artifact, tmp_path):
    path, digest, _ = artifact
    link = tmp_path / "stage-1"
    link.symlink_to(path)
    assert verify_artifact(link).manifest_hash == digest
    document = json.loads((path / "manifest.json").read_text())
    document["stage_index"] = 0
    (path / "manifest.json").write_text(json.dumps(document))
    assert _reason(link) == "ARTIFACT_MANIFEST_HASH_MISMATCH"


def test_the_stored_manifest_names_the_layer_end_layer_end_exclusive(artifact):
    """Manifests on disk, and the hashes over them, keep the name they were written with."""
    path, digest, _ = artifact
    raw = (path / "manifest.json").read_bytes()
    stored = json.loads(raw)["layers"]
    assert "layer_end_exclusive" in stored and "layer_end" not in stored
    manifest = decode_manifest(raw)
    assert manifest.layers.layer_end == stored["layer_end_exclusive"]
    assert encode_manifest(manifest) == raw and manifest_hash(manifest) == digest


def test_a_manifest_using_the_python_field_name_is_refused(artifact):
    path, _, _ = artifact
    document = json.loads((path / "manifest.json").read_bytes())
    layers = document["layers"]
    layers["layer_end"] = layers.pop("layer_end_exclusive")
    with pytest.raises(errors.ManifestInvalidError, match="unknown fields \\['layer_end'\\]"):
        decode_manifest(json.dumps(document).encode())
    del layers["layer_end"]
    with pytest.raises(errors.ManifestInvalidError, match="missing fields \\['layer_end_exclusive'\\]"):
        decode_manifest(json.dumps(document).encode())
