"""Settings for the whole test run.

One MAX compile cache serves every test and every process the tests start: the run exports
FORNAX_COMPILE_CACHE_DIR (default ~/.cache/fornax/max) to the stage workers and orchestrators
it launches, and points this process's in-process MAX kernels at the same directory. Each
distinct graph then compiles at most once per run, and a machine that has run the suite
before pays only cache hits. The MAX tests all use one checkpoint shape
(tests/unit/model_max/conftest.py), so a cold run compiles one graph per layer kind and
weight dtype.
"""

from __future__ import annotations

import os

import pytest

from libs.model.max_kernels import CACHE_DIR_ENV, configure_max_process, default_cache_dir


def pytest_configure(config: pytest.Config) -> None:
    cache = default_cache_dir(os.environ)
    os.environ[CACHE_DIR_ENV] = str(cache)
    configure_max_process(os.environ, cache)
