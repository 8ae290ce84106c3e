from tests.unit.model.conftest import tiny_checkpoint, variant_checkpoint  # noqa: F401  (shared fixtures)
