"""The MAX integration tests share the unit area's checkpoint; the compile cache is the run's
one cache (tests/conftest.py)."""

import pytest

pytest.importorskip("max")
