from tests.unit.model.conftest import tiny_checkpoint  # noqa: F401  (shared fixture)
