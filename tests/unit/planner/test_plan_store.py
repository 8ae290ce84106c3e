import pytest

from libs.service.errors import NotFound
from services.planner.inventory import Target
from services.planner.planner import plan
from services.planner.server import PlanStore
from tests.unit.planner.factories import full_mesh, node, tiny_model


def test_store_keeps_the_newest_plans_and_names_missing_ones():
    store = PlanStore(capacity=2)
    plans = [plan(tiny_model(), full_mesh(node("a")), Target(context_tokens=c)).plan for c in (64, 128, 256)]
    for p in plans:
        store.put(p)
    assert store.get(plans[2].plan_id) is plans[2] and store.get(plans[1].plan_id) is plans[1]
    with pytest.raises(NotFound) as err:
        store.get(plans[0].plan_id)
    assert (err.value.reason, err.value.field) == ("PLAN_NOT_FOUND", "plan_id")
