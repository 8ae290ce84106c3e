"""The control-plane protos stay compatible with the committed baseline image.

`make proto-check` runs `buf breaking` (FILE rules) against proto/baseline.binpb, so a change
that would break a fleet mid-upgrade fails unless `make proto-baseline` moves the baseline in
the same commit. These tests run the same check on scratch copies of the protos.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = REPO_ROOT / "proto"
BASELINE = PROTO_DIR / "baseline.binpb"
STAGE_WORKER_PROTO = Path("fornax/stage_worker/v1/stage_worker.proto")


def buf() -> str:
    path = Path(sys.executable).parent / "buf"
    found = str(path) if path.exists() else shutil.which("buf")
    assert found, "buf is installed with the project (buf-bin in requirements.lock)"
    return found


def breaking(proto_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([buf(), "breaking", "--against", str(BASELINE)], cwd=proto_dir,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    copy = tmp_path / "proto"
    shutil.copytree(PROTO_DIR, copy, ignore=shutil.ignore_patterns(BASELINE.name))
    return copy


def edit(root: Path, pattern: str, replacement: str) -> None:
    path = root / STAGE_WORKER_PROTO
    text, count = re.subn(pattern, replacement, path.read_text(), count=1, flags=re.S)
    assert count == 1, pattern
    path.write_text(text)


def test_the_checked_in_protos_do_not_break_the_baseline(scratch):
    done = breaking(scratch)
    assert done.returncode == 0, done.stdout + done.stderr


def test_deleting_a_field_breaks_the_baseline(scratch):
    edit(scratch, r"(message LoadStageRequest \{\n  string request_id = 1;\n)  StageSpec spec = 2;\n", r"\1")
    done = breaking(scratch)
    assert done.returncode != 0
    assert '"spec" on message "LoadStageRequest" was deleted' in done.stdout, done.stdout + done.stderr


def test_renumbering_a_field_breaks_the_baseline(scratch):
    edit(scratch, r"(message LoadStageRequest \{\n  string request_id = 1;\n  StageSpec spec = )2;", r"\g<1>3;")
    done = breaking(scratch)
    assert done.returncode != 0 and "LoadStageRequest" in done.stdout, done.stdout + done.stderr


def test_adding_a_field_is_compatible(scratch):
    edit(scratch, r"(message LoadStageRequest \{\n  string request_id = 1;\n  StageSpec spec = 2;\n)",
         r"\1  string note = 3;\n")
    done = breaking(scratch)
    assert done.returncode == 0, done.stdout + done.stderr
