"""A stage profile records the block-format activations its MAX graphs were timed in: it
round-trips, an old max record without it reads as int8 (what it timed), a numpy profile has none,
and a mode nothing runs is refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from apps.cli.profile import render
from apps.fleet.profiling import FleetProfiles, StoredStage
from libs.model.max_kernels import BLOCK_ACTIVATIONS
from libs.profiles.schema import (
    DEFAULT_MAX_ACTIVATIONS,
    MAX_ACTIVATIONS,
    ProfileFormatError,
    StageProfile,
    stage_profile_from_json,
    to_json,
)
from services.evidence_registry.domain import BlobRef, Record, RecordStatus
from services.evidence_registry.profile_records import stage_profile_record
from tests.unit.planner.profile_factories import stage_profile

SNAP = "sha256:" + "a" * 64


def _without_mode(profile: StageProfile) -> bytes:
    """The profile's blob as a worker wrote it before the mode was recorded."""
    data = json.loads(to_json(profile))
    del data["max_activations"]
    return json.dumps(data).encode()


def test_the_schema_knows_the_modes_the_max_backend_runs():
    assert MAX_ACTIVATIONS == BLOCK_ACTIVATIONS and DEFAULT_MAX_ACTIVATIONS == "int8"


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_a_max_profile_round_trips_its_mode(mode):
    profile = replace(stage_profile("a", SNAP), max_activations=mode)
    blob = to_json(profile)
    assert json.loads(blob)["max_activations"] == mode
    back = stage_profile_from_json(blob)
    assert back == profile and back.max_activations == mode and back.activations_label == f"{mode} activations"
    assert to_json(back) == blob


def test_an_old_max_record_reads_as_int8_and_an_old_numpy_record_as_none():
    old_max = stage_profile_from_json(_without_mode(replace(stage_profile("a", SNAP), max_activations="float32")))
    assert old_max.max_activations == "int8"
    old_numpy = stage_profile_from_json(_without_mode(stage_profile("b", SNAP, backend="numpy")))
    assert old_numpy.max_activations == "" and old_numpy.activations_label == ""
    # A max profile built without the mode is the worker's default too.
    assert stage_profile("c", SNAP).max_activations == "int8"


def test_an_unknown_mode_or_a_mode_on_numpy_is_refused():
    data = json.loads(to_json(stage_profile("a", SNAP)))
    with pytest.raises(ProfileFormatError, match="int4"):
        stage_profile_from_json(json.dumps({**data, "max_activations": "int4"}).encode())
    numpy = json.loads(to_json(stage_profile("b", SNAP, backend="numpy")))
    with pytest.raises(ProfileFormatError, match="numpy profile"):
        stage_profile_from_json(json.dumps({**numpy, "max_activations": "float32"}).encode())


def test_the_record_labels_and_provenance_name_the_mode():
    content, _ = stage_profile_record(replace(stage_profile("a", SNAP), max_activations="float32"), (0, 2), "h")
    assert dict(content.labels)["max_activations"] == "float32"
    assert content.provenance.backend_build == "max test-build (float32 activations)"
    numpy, _ = stage_profile_record(stage_profile("b", SNAP, backend="numpy"), (0, 2), "h")
    assert "max_activations" not in dict(numpy.labels) and numpy.provenance.backend_build == "numpy test-build"


def test_fornax_profile_prints_the_mode_a_max_profile_timed():
    profile = replace(stage_profile("a", SNAP), max_activations="float32")
    content, blob = stage_profile_record(profile, (0, 2), "h")
    record = Record("s1", content, BlobRef("0" * 64, len(blob)), RecordStatus.ACTIVE, 0)
    text = render(FleetProfiles(SNAP, (StoredStage(profile, record),), ()))
    assert "build: max test-build timed in float32 activations on cpu" in text
    numpy = stage_profile("b", SNAP, backend="numpy")
    assert "timed in" not in render(FleetProfiles(SNAP, (StoredStage(numpy, record),), ()))
