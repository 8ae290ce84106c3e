"""Each image's wheel list covers every distribution its service imports at start.

A service is imported in a fresh interpreter; each imported top-level module is mapped to the
distribution that ships it, and that distribution must be in the image's requirement closure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.unit.helm.test_dockerfiles import SERVICES, requirement_names
from tests.unit.helm.tools import REPO_ROOT

# Imported only opportunistically, inside try/except, when present: structlog tries rich,
# OpenTelemetry's resource detector tries psutil, grpc tries grpc_tools; setuptools' import hook
# and the project itself are never wheel dependencies of an image.
OPPORTUNISTIC = {"rich", "pygments", "attrs", "psutil", "grpcio-tools", "setuptools", "fornax"}

PROBE = """
import importlib, json, sys
from importlib import metadata
for name in sys.argv[1:]:
    importlib.import_module(name)
dists = metadata.packages_distributions()
found = sorted({d for m in list(sys.modules) for d in dists.get(m.split('.')[0], [])})
print(json.dumps(found))
"""


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def closure(names: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = [normalise(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.requires(name) or ():
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalise(req.name))
    return seen


def imported_distributions(service: str) -> set[str]:
    modules = [f"services.{service}.__main__", f"services.{service}.server"]
    done = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr
    return {normalise(d) for d in json.loads(done.stdout)}


@pytest.mark.parametrize("service", SERVICES)
def test_image_requirements_cover_the_service_imports(service):
    missing = imported_distributions(service) - closure(requirement_names(service)) - OPPORTUNISTIC
    assert not missing, f"{service} imports {sorted(missing)}; add them to images/requirements/{service}.txt"


def test_closure_follows_transitive_requirements():
    assert "opentelemetry-api" in closure({"opentelemetry-sdk"})
    assert "max" not in closure({"numpy"})
