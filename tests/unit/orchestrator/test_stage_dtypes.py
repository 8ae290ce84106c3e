"""Each stage is told the dtype of the hop into it and the hop out of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.common.kinds import DType
from libs.service.errors import FailedPrecondition
from services.orchestrator.route.install import InstallSpec, stage_dtypes


def _spec(hops: tuple[DType, ...], default: DType = DType.FP32) -> InstallSpec:
    return InstallSpec("ck", len(hops) + 1, None, default, Path("state"), hop_dtypes=hops)


def test_without_hops_every_stage_uses_the_route_dtype():
    assert [stage_dtypes(_spec((), DType.BF16), i, 3) for i in range(3)] == [(DType.BF16, DType.BF16)] * 3


def test_each_stage_gets_the_hops_around_it():
    spec = _spec((DType.BF16, DType.FP32))
    assert [stage_dtypes(spec, i, 3) for i in range(3)] == [
        (DType.BF16, DType.BF16), (DType.BF16, DType.FP32), (DType.FP32, DType.FP32)]


def test_hops_that_do_not_fit_the_plan_are_refused():
    with pytest.raises(FailedPrecondition) as refused:
        stage_dtypes(_spec((DType.BF16,)), 0, 3)
    assert refused.value.reason == "HOP_DTYPES_MISMATCH"
