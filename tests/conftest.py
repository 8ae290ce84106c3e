"""Settings for the whole test run.

One MAX compile cache serves every test and every process the tests start: the run exports
FORNAX_COMPILE_CACHE_DIR (default ~/.cache/fornax/max) to the stage workers and orchestrators
it launches, and points this process's in-process MAX kernels at the same directory. Each
distinct graph then compiles at most once per run, and a machine that has run the suite
before pays only cache hits. The MAX tests all use one checkpoint shape
(tests/unit/model_max/conftest.py), so a cold run compiles one graph per layer kind and
weight dtype.

Every test runs in a working directory of its own, empty, with no FORNAX_TLS_* from the
user's shell: the CLIs and services default their state to `.fornax` under the working
directory, and a test must not pick up the certificates, fleet.json or registry that a
user's `make run` left in the checkout (tests/integration/user_state checks this).
"""

from __future__ import annotations

import os

import pytest

from libs.model.max_kernels import CACHE_DIR_ENV, configure_max_process, default_cache_dir

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a user's shell may export that a CLI reads as its credentials.
USER_TLS_ENV = ("FORNAX_TLS_CA", "FORNAX_TLS_CERT", "FORNAX_TLS_KEY")


@pytest.fixture(autouse=True)
def own_working_directory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    # Subprocesses run as `python -m tests....` still find the suite's modules from there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    for name in USER_TLS_ENV:
        monkeypatch.delenv(name, raising=False)


def pytest_configure(config: pytest.Config) -> None:
    cache = default_cache_dir(os.environ)
    os.environ[CACHE_DIR_ENV] = str(cache)
    configure_max_process(os.environ, cache)
