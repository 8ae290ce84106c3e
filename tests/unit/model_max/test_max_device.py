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


def test_wrongly_shaped_layer_weights_fail_closed(full_stage):
    import dataclasses

    from libs.model.errors import CheckpointError
    from libs.model.max_runtime import layer_registry

    cfg, weights = full_stage
    layer = weights.layer(1)
    assert set(layer_registry(cfg, 1, layer)) >= {"router", "kv_b_k", "kv_b_v", "o_proj"}
    bad_attention = dataclasses.replace(layer.attention, kv_b_proj=layer.attention.kv_b_proj[:, :-1])
    with pytest.raises(CheckpointError, match="kv_b_proj"):
        layer_registry(cfg, 1, dataclasses.replace(layer, attention=bad_attention))
