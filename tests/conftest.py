"""Settings for the whole test run.

One MAX compile cache serves every test and every process the tests start (stage workers
read FORNAX_COMPILE_CACHE_DIR, in-process kernels FORNAX_MAX_CACHE_DIR), so each distinct
graph compiles at most once per run, and a machine that has run the suite before pays only
cache hits. The MAX tests all use one checkpoint shape (tests/unit/model_max/conftest.py),
so a cold run compiles one graph per layer kind and weight dtype.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def compile_cache_dir() -> Path:
    configured = os.environ.get("FORNAX_MAX_CACHE_DIR") or os.environ.get("FORNAX_COMPILE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "fornax" / "max"


def pytest_configure(config: pytest.Config) -> None:
    cache = str(compile_cache_dir())
    os.environ["FORNAX_MAX_CACHE_DIR"] = cache
    os.environ["FORNAX_COMPILE_CACHE_DIR"] = cache
    os.environ.setdefault("MODULAR_TELEMETRY_ENABLED", "0")
