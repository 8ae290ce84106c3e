from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.unit.helm.tools import CHART_DIR, helm_binary

VALUES_DIR = Path(__file__).parent / "values"
RELEASE = "fx"
NAMESPACE = "fornax"


@dataclass(frozen=True)
class Rendering:
    """The objects of one `helm template` run, looked up by kind and name."""

    objects: tuple[dict, ...]

    def get(self, kind: str, name: str) -> dict:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
        return found[0]

    def kinds(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]


@dataclass(frozen=True)
class HelmRun:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def helm() -> str:
    return helm_binary()


def run_helm_template(helm: str, values_files: list[Path], extra: list[str] | None = None) -> HelmRun:
    cmd = [helm, "template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE]
    for path in values_files:
        cmd += ["-f", str(path)]
    done = subprocess.run(cmd + (extra or []), capture_output=True, text=True, timeout=60, check=False)
    return HelmRun(done.returncode, done.stdout, done.stderr)


def render(helm: str, values_files: list[Path]) -> Rendering:
    run = run_helm_template(helm, values_files)
    assert run.returncode == 0, run.stderr
    docs = [d for d in yaml.safe_load_all(run.stdout) if d]
    return Rendering(tuple(docs))


@pytest.fixture(scope="session")
def renderings(helm: str) -> dict[str, Rendering]:
    """Default values, a production-like install, a three-stage fleet, an external worker."""
    return {
        "default": render(helm, []),
        "production": render(helm, [VALUES_DIR / "production.yaml"]),
        "three-stages": render(helm, [VALUES_DIR / "three-stages.yaml"]),
        "external-worker": render(helm, [VALUES_DIR / "external-worker.yaml"]),
    }
