"""Which certificate identity each local service gets."""

from __future__ import annotations

import pytest

from apps.fleet.trust import identity_for
from libs.security.identity import service_identity, stage_identity


def test_a_stage_worker_and_its_numpy_stand_in_share_the_stage_identity():
    assert identity_for("stage_worker_1", "stage_worker") == stage_identity(1)
    assert identity_for("stage_worker_1_reference", "stage_worker") == stage_identity(1)
    assert identity_for("planner", "planner") == service_identity("planner")


@pytest.mark.parametrize("name", ["stage_worker_x", "stage_worker_1_spare", "worker_1"])
def test_an_unknown_stage_worker_name_is_refused(name):
    with pytest.raises(ValueError, match="stage_worker_<index>"):
        identity_for(name, "stage_worker")
