"""Lease numbers belong to the plan generation: every route on it draws from one counter,
which never goes below what stage 0 reports having seen."""

import gc
import uuid

import pytest

from services.orchestrator.route import lease_numbers
from services.orchestrator.route.lease_numbers import LeaseNumbers


def test_routes_of_one_generation_share_a_counter_and_other_generations_do_not():
    generation, other = str(uuid.uuid4()), str(uuid.uuid4())
    first, second = lease_numbers.for_generation(generation), lease_numbers.for_generation(generation)
    assert first is second
    assert [first.take(), second.take(), first.take()] == [0, 1, 2]
    assert lease_numbers.for_generation(other).take() == 0


def test_the_receivers_floor_raises_the_counter_and_never_lowers_it():
    numbers = LeaseNumbers()
    numbers.raise_to(40)
    assert numbers.take() == 40
    numbers.raise_to(3)  # a stage that saw less than this process numbered
    assert numbers.take() == 41 and numbers.next == 42
    with pytest.raises(ValueError):
        LeaseNumbers(-1)


def test_a_generation_without_routes_holds_no_counter():
    generation = str(uuid.uuid4())
    numbers = lease_numbers.for_generation(generation)
    numbers.raise_to(10)
    del numbers
    gc.collect()
    # A fresh counter: a route opened now starts from stage 0's floor (its ACK), not from 10.
    assert lease_numbers.for_generation(generation).next == 0
