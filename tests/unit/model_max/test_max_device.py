"""Device selection is explicit and fails closed; nothing here compiles a graph."""

from __future__ import annotations

import pytest

pytest.importorskip("max")

from libs.model.errors import BackendUnavailableError  # noqa: E402
from libs.model.kernels import make_kernels  # noqa: E402
from libs.model.max_kernels import MaxOptions, make_max_kernels  # noqa: E402


def test_gpu_without_accelerator_is_an_error(full_stage):
    from max.driver import accelerator_count

    if accelerator_count() > 0:
        pytest.skip("an accelerator is present")
    cfg, weights = full_stage
    with pytest.raises(BackendUnavailableError, match="no accelerator"):
        make_kernels("max", cfg, weights, "gpu")


@pytest.mark.parametrize("options", [MaxOptions(device="tpu"), MaxOptions(weight_dtype="int4")])
def test_unknown_device_or_dtype_is_an_error(full_stage, options):
    cfg, weights = full_stage
    with pytest.raises(BackendUnavailableError):
        make_max_kernels(cfg, weights, options.device, options)
