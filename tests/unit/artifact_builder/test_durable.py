"""Artifact commits are durable (every file fsynced before the rename) and a build removes
the temp directories and half-made links an interrupted build left behind."""

from __future__ import annotations

import os
import subprocess
import sys

from libs.artifacts.manifest import CONFIG_FILE, MANIFEST_FILE, WEIGHTS_FILE
from services.artifact_builder import durable
from services.artifact_builder.build import STORE_DIR
from tests.unit.artifact_builder.fixtures import write_checkpoint
from tests.unit.artifact_builder.test_build import build


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_every_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(source, target):
        events.append(("rename", str(source)))
        real_rename(source, target)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "rename", rename)
    result, _ = build(write_checkpoint(tmp_path / "ck"), tmp_path / "out", stages=2)
    renames = [i for i, (kind, _) in enumerate(events) if kind == "rename"]
    assert len(renames) == len(result.stages)
    for index in renames:
        source = events[index][1]
        synced = {path for kind, path in events[:index] if kind == "fsync"}
        assert {f"{source}/{name}" for name in (WEIGHTS_FILE, CONFIG_FILE, MANIFEST_FILE)} <= synced
        assert source in synced  # the directory itself, after its files
    parents = {path for kind, path in events if kind == "fsync"}
    assert str(tmp_path / "out" / STORE_DIR) in parents and str(tmp_path / "out") in parents


def test_a_build_removes_what_an_interrupted_build_left(tmp_path):
    out = tmp_path / "out"
    store = out / STORE_DIR
    store.mkdir(parents=True)
    dead = store / f"{durable.TEMP_STAGE_PREFIX}0-{_dead_pid()}-abc"
    legacy = store / f"{durable.TEMP_STAGE_PREFIX}1-xyz"  # from before pids were recorded
    live = store / f"{durable.temp_stage_prefix(3)}keep"  # a build of this process, running
    for directory in (dead, legacy, live):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"partial")
    half_link = out / ".stage-0.tmp-0123abcd"
    os.symlink("nowhere", half_link)
    build(write_checkpoint(tmp_path / "ck"), out, stages=2)
    assert not dead.exists() and not legacy.exists() and not os.path.lexists(half_link)
    assert live.exists()
