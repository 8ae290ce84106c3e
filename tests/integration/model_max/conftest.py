"""The MAX integration tests share the unit area's checkpoint and compile-cache setup."""

import pytest

pytest.importorskip("max")

import tests.unit.model_max.conftest  # noqa: E402,F401  (configures this process for MAX)
