"""Model files from the builder are kept only when every hash checks out."""

from __future__ import annotations

import hashlib

import pytest

from fornax.artifact_builder.v1 import artifact_builder_pb2 as ab_pb
from libs.artifacts.manifest import SourceLineage, StageManifest
from libs.service.errors import FailedPrecondition
from libs.text.context import TextPins
from services.orchestrator.route.remote_files import ModelFileHashMismatch, check_text_pins, write_model_files


def _file(path: str, content: bytes, sha: str | None = None) -> ab_pb.ModelFile:
    return ab_pb.ModelFile(path=path, content=content, sha256=sha or hashlib.sha256(content).hexdigest())


def _reply(**overrides) -> ab_pb.GetModelFilesResponse:
    files = {"config.json": _file("config.json", b"{}"), "tokenizer.json": _file("tokenizer.json", b"tok")}
    files.update(overrides)
    return ab_pb.GetModelFilesResponse(files=list(files.values()), snapshot=ab_pb.CheckpointSnapshot(
        snapshot_id="sha256:abc", config_sha256=hashlib.sha256(b"{}").hexdigest(),
        tokenizer_sha256=hashlib.sha256(b"tok").hexdigest()))


def test_checked_files_land_in_the_private_state_dir(tmp_path):
    directory = write_model_files(_reply(), tmp_path)
    assert directory.is_relative_to(tmp_path) and (directory / "tokenizer.json").read_bytes() == b"tok"


@pytest.mark.parametrize("bad", [
    {"tokenizer.json": _file("tokenizer.json", b"tok", sha="0" * 64)},      # bytes differ from their hash
    {"tokenizer.json": _file("tokenizer.json", b"other")},                   # not the snapshot's tokenizer
    {"config.json": _file("config.json", b'{"x": 1}')},                      # not the snapshot's config
    {"evil": _file("../evil", b"x")},                                        # outside the model directory
])
def test_any_mismatch_is_refused_and_nothing_is_kept(tmp_path, bad):
    with pytest.raises(ModelFileHashMismatch) as refused:
        write_model_files(_reply(**bad), tmp_path)
    assert refused.value.reason == "MODEL_FILE_HASH_MISMATCH"
    assert not (tmp_path / "models").exists()


def _manifest(tokenizer: str) -> StageManifest:
    lineage = SourceLineage("s", "", "", "c", tokenizer, "t", "i", ())
    return StageManifest("schema", 0, 1, None, True, True, False, (), None, lineage, None, None, "fp32", 0, (), ())


def test_stages_built_from_another_tokenizer_are_refused():
    pins = TextPins(tokenizer_sha256="a", template_sha256="t")
    check_text_pins([_manifest("a"), _manifest("a")], pins)
    with pytest.raises(FailedPrecondition) as refused:
        check_text_pins([_manifest("a"), _manifest("b")], pins)
    assert refused.value.reason == "TEXT_IDENTITY_MISMATCH"
