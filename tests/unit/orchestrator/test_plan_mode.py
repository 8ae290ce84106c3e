"""Which evidence an install plans from: none, the registry's profiles, or a refusal."""

from __future__ import annotations

import asyncio

import pytest

from libs.service.errors import FailedPrecondition
from services.orchestrator.route.install import Fleet, profile_records


def test_deployment_without_a_registry_is_refused_and_exploratory_plans_from_declared_figures():
    with pytest.raises(FailedPrecondition) as refused:
        asyncio.run(profile_records(Fleet("p:1", "b:1", ("w:1",), plan_mode="deployment")))
    assert refused.value.reason == "NO_EVIDENCE_REGISTRY"
    assert asyncio.run(profile_records(Fleet("p:1", "b:1", ("w:1",)))) is None
