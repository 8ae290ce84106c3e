"""What a ProfileStage request's grid becomes: the decode context grid and its bounds."""

from __future__ import annotations

import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.profiles.schema import DECODE_CONTEXTS
from libs.service.errors import InvalidArgument
from services.stage_worker.profiling import MAX_CONTEXT, grid_from


def test_no_context_asked_is_the_default_context_grid():
    grid = grid_from(pb.ProfileStageRequest())
    assert grid.decode_contexts == DECODE_CONTEXTS and grid.context_tokens == max(DECODE_CONTEXTS)


def test_a_context_grid_is_measured_ascending_once_each_and_a_lone_context_is_a_one_point_grid():
    assert grid_from(pb.ProfileStageRequest(decode_contexts=[512, 32, 32])).decode_contexts == (32, 512)
    assert grid_from(pb.ProfileStageRequest(context_tokens=64)).decode_contexts == (64,)  # an older client


@pytest.mark.parametrize("contexts", [[0], [MAX_CONTEXT + 1], list(range(1, 10))])
def test_a_context_grid_out_of_bounds_is_refused(contexts):
    with pytest.raises(InvalidArgument) as caught:
        grid_from(pb.ProfileStageRequest(decode_contexts=contexts))
    assert caught.value.reason == "INVALID_GRID" and caught.value.field == "decode_contexts"
