"""Every service has a hadolint-clean, multi-stage, non-root Dockerfile that builds offline."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest

from tests.unit.helm.tools import REPO_ROOT, hadolint_binary

SERVICES = ("orchestrator", "planner", "evidence_registry", "artifact_builder", "stage_worker")
REQUIREMENTS_DIR = REPO_ROOT / "images" / "requirements"


def dockerfile(service: str) -> str:
    return (REPO_ROOT / "services" / service / "Dockerfile").read_text()


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def requirement_names(service: str) -> set[str]:
    names: set[str] = set()
    for line in (REQUIREMENTS_DIR / f"{service}.txt").read_text().splitlines():
        line = line.strip()
        if line.startswith("-r "):
            names |= {n for n in _names_in(REQUIREMENTS_DIR / line[3:].strip())}
        elif line and not line.startswith("#"):
            names.add(line.lower())
    return names


def _names_in(path) -> set[str]:
    return {ln.strip().lower() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def test_every_service_directory_has_a_dockerfile():
    dirs = {p.parent.name for p in (REPO_ROOT / "services").glob("*/__main__.py")}
    assert dirs == set(SERVICES)
    for service in SERVICES:
        assert (REPO_ROOT / "services" / service / "Dockerfile").is_file()


@pytest.mark.parametrize("service", SERVICES)
def test_hadolint_is_clean(service):
    path = REPO_ROOT / "services" / service / "Dockerfile"
    done = subprocess.run([hadolint_binary(), "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install -y curl\nRUN cd /tmp && pip install requests\n")
    done = subprocess.run([hadolint_binary(), "--no-color", str(bad)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "DL3006" in done.stdout


@pytest.mark.parametrize("service", SERVICES)
def test_image_is_multi_stage_non_root_and_offline(service):
    steps = instructions(dockerfile(service))
    froms = [args for word, args in steps if word == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith(" AS build")
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM"):]
    users = [args for word, args in final if word == "USER"]
    assert users and all(int(u.split(":")[0]) > 0 for u in users)
    build = steps[: len(steps) - len(final)]
    assert ("RUN", "fornax-install-wheels") in build
    for word, args in steps:
        assert word != "ADD", "ADD can fetch URLs; COPY only"
        assert not (word == "RUN" and ("pip" in args or "apt" in args)), f"{word} {args} installs on its own"
    assert not [a for w, a in final if w == "COPY" and "wheels" in a], "the wheelhouse stays in the build stage"


def test_wheel_installer_never_uses_an_index():
    script = (REPO_ROOT / "scripts" / "images" / "install_wheels.sh").read_text()
    (helper,) = [line for line in script.splitlines() if "/pip install" in line]
    assert "--no-index" in helper
    assert script.count("pip_install ") == 2 and "--find-links=/wheels" in script


@pytest.mark.parametrize("service", SERVICES)
def test_entrypoint_is_the_service_console_script(service):
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    script = f"fornax-{service.replace('_', '-')}"
    assert scripts[script] == f"services.{service}.__main__:main"
    (entrypoint,) = [args for word, args in instructions(dockerfile(service)) if word == "ENTRYPOINT"]
    assert entrypoint == f'["/opt/fornax/bin/{script}"]'


def test_only_the_stage_worker_carries_max():
    for service in SERVICES:
        assert ("max" in requirement_names(service)) == (service == "stage_worker"), service


def test_image_version_matches_the_chart_app_version():
    import yaml

    chart = yaml.safe_load((REPO_ROOT / "helm" / "fornax" / "Chart.yaml").read_text())
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
