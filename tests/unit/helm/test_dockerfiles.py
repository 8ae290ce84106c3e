"""One hadolint-clean, multi-stage, non-root Dockerfile template builds every service offline;
a service's image differs only in the build args scripts/images/build.sh gives it."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest

from tests.unit.helm.tools import REPO_ROOT, hadolint_binary

SERVICES = ("orchestrator", "planner", "evidence_registry", "artifact_builder", "stage_worker")
REQUIREMENTS_DIR = REPO_ROOT / "images" / "requirements"
TEMPLATE = REPO_ROOT / "images" / "Dockerfile"
BUILD_SCRIPT = REPO_ROOT / "scripts" / "images" / "build.sh"
# Ports beyond gRPC (50051) and metrics (9464): the orchestrator's HTTP API, a stage's FNX2.
EXTRA_PORTS = {"orchestrator": ["8000"], "stage_worker": ["7070"]}


def dockerfile() -> str:
    return TEMPLATE.read_text()


def build_args(*services: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BUILD_SCRIPT), "--print-build-args", *services], capture_output=True,
                          text=True, timeout=60, check=False)


def parsed_build_args() -> dict[str, dict[str, str]]:
    done = build_args()
    assert done.returncode == 0, done.stderr
    args: dict[str, dict[str, str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            current = args.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current[key] = value
    return args


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
            names |= _names_in(REQUIREMENTS_DIR / line[3:].strip())
        elif line and not line.startswith("#"):
            names.add(line.lower())
    return names


def _names_in(path) -> set[str]:
    return {ln.strip().lower() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def test_every_service_is_built_from_the_one_template():
    dirs = {p.parent.name for p in (REPO_ROOT / "services").glob("*/__main__.py")}
    assert dirs == set(SERVICES)
    assert set(parsed_build_args()) == set(SERVICES)
    assert not list((REPO_ROOT / "services").glob("*/Dockerfile")), "one template, no per-service copies"
    script = BUILD_SCRIPT.read_text()
    assert "-f images/Dockerfile" in script and "services/$svc/Dockerfile" not in script


def test_an_unknown_service_has_no_build_args():
    done = build_args("no_such_service")
    assert done.returncode != 0 and "unknown service no_such_service" in done.stderr


def test_hadolint_is_clean():
    done = subprocess.run([hadolint_binary(), "--no-color", str(TEMPLATE)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install -y curl\nRUN cd /tmp && pip install requests\n")
    done = subprocess.run([hadolint_binary(), "--no-color", str(bad)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "DL3006" in done.stdout


def test_image_is_multi_stage_non_root_and_offline():
    steps = instructions(dockerfile())
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
def test_entrypoint_and_ports_are_the_service_s_own(service):
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    args = parsed_build_args()[service]
    assert args["SERVICE"] == service
    assert scripts[args["ENTRYPOINT"]] == f"services.{service}.__main__:main"
    assert args["PORTS"].split() == ["50051", "9464", *EXTRA_PORTS.get(service, [])]


def test_template_runs_the_console_script_its_build_arg_names():
    steps = instructions(dockerfile())
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM"):]
    declared = {args.split("=")[0] for word, args in final if word == "ARG"}
    assert {"SERVICE", "ENTRYPOINT", "PORTS"} <= declared
    (entrypoint,) = [args for word, args in final if word == "ENTRYPOINT"]
    assert entrypoint == '["/opt/fornax/bin/fornax-service"]'
    (link,) = [args for word, args in final if word == "RUN" and "ln -s" in args]
    assert '"/opt/fornax/bin/${ENTRYPOINT}" /opt/fornax/bin/fornax-service' in link
    assert ("EXPOSE", "${PORTS}") in final
    # The chart's seed-compile-cache init container copies from where the template puts the
    # build-time MAX compile cache.
    seed_dir = "/opt/fornax/compile-cache-seed"
    assert ("COPY", f"compile-cache/ {seed_dir}/") in final
    chart = (REPO_ROOT / "helm" / "fornax" / "templates" / "stage-worker.yaml").read_text()
    assert f'$seedDir := "{seed_dir}"' in chart


def test_only_the_stage_worker_carries_max():
    for service in SERVICES:
        assert ("max" in requirement_names(service)) == (service == "stage_worker"), service


def test_image_version_matches_the_chart_app_version():
    import yaml

    chart = yaml.safe_load((REPO_ROOT / "helm" / "fornax" / "Chart.yaml").read_text())
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
