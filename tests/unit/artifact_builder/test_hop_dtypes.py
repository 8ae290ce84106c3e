"""Per-hop boundary dtypes become each stage's recorded boundary contract."""

from __future__ import annotations

import pytest

from libs.artifacts.verify import verify_artifact
from libs.common.kinds import DType
from services.artifact_builder.build import BuildOptions, BuildResult, build_stage_artifacts
from services.artifact_builder.errors import PlanInvalidError
from services.artifact_builder.snapshot import inspect_checkpoint
from services.artifact_builder.staging import even_layer_ranges, plan_from_ranges
from tests.unit.artifact_builder.fixtures import write_checkpoint

BF16, FP32 = "ELEMENT_TYPE_BF16", "ELEMENT_TYPE_FP32"
AS_DTYPE = {BF16: DType.BF16, FP32: DType.FP32, "ELEMENT_TYPE_INT8": "int8"}


def _build(tmp_path, stages: int, hops: tuple[str, ...]):
    inspection = inspect_checkpoint(write_checkpoint(tmp_path / "ck"))
    plan = plan_from_ranges(even_layer_ranges(inspection.config.num_hidden_layers, stages))
    events = list(build_stage_artifacts(inspection, plan, BuildOptions(tmp_path / "out", DType.FP32, 1 << 16,
                                                                               tuple(AS_DTYPE[h] for h in hops))))
    assert isinstance(events[-1], BuildResult)
    return [verify_artifact(s.artifact_dir).manifest for s in events[-1].stages]


def test_each_stage_records_the_hops_around_it(tmp_path):
    first, middle, last = _build(tmp_path, 3, (BF16, FP32))
    assert first.boundary_input.dtype == "ELEMENT_TYPE_INT32" and first.boundary_output.dtype == BF16
    assert (middle.boundary_input.dtype, middle.boundary_output.dtype) == (BF16, FP32)
    assert last.boundary_input.dtype == FP32 and last.boundary_output.kind == "TENSOR_KIND_LOGITS"


@pytest.mark.parametrize("hops", [(BF16,), (BF16, FP32, FP32), ("ELEMENT_TYPE_INT8", FP32)])
def test_hops_that_do_not_fit_the_plan_are_refused(tmp_path, hops):
    with pytest.raises(PlanInvalidError) as refused:
        _build(tmp_path, 3, hops)
    assert refused.value.field == "hop_boundary_dtypes"
