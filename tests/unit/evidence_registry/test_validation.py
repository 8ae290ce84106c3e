"""Bad input is refused with the field named; physical records must name their provenance."""

from __future__ import annotations

import dataclasses

import pytest

from services.evidence_registry.domain import (
    EvidenceClass,
    LayerRange,
    Provenance,
    PutCommand,
    RecordType,
    RevokeCommand,
)
from services.evidence_registry.errors import InvalidField
from services.evidence_registry.validation import PHYSICAL_REQUIRED, check_put, check_revoke, parse_sha256
from tests.unit.evidence_registry.factories import PHYSICAL_PROVENANCE, content, physical, window

LIMIT = 1 << 20


def refused(command: PutCommand) -> InvalidField:
    with pytest.raises(InvalidField) as err:
        check_put(command, LIMIT)
    return err.value


def test_complete_physical_record_is_accepted():
    check_put(PutCommand(content=physical(), blob=b"x"), LIMIT)


@pytest.mark.parametrize("missing", PHYSICAL_REQUIRED)
def test_physical_record_without_provenance_field_is_refused(missing):
    provenance = dataclasses.replace(PHYSICAL_PROVENANCE, **{missing: "  "})
    error = refused(PutCommand(content=physical(provenance=provenance), blob=b"x"))
    assert error.field == f"record.provenance.{missing}"
    assert error.reason == "MISSING_PROVENANCE"
    assert error.field in str(error)


@pytest.mark.parametrize("missing,empty", [("layer_range", None), ("dtype", None), ("shapes", " ")])
@pytest.mark.parametrize("record_type", [RecordType.MEASUREMENT, RecordType.CALIBRATION])
def test_physical_execution_record_must_name_layers_dtype_and_shapes(missing, empty, record_type):
    provenance = dataclasses.replace(PHYSICAL_PROVENANCE, **{missing: empty})
    error = refused(PutCommand(content=physical(record_type, provenance=provenance), blob=b"x"))
    assert (error.field, error.reason) == (f"record.provenance.{missing}", "MISSING_PROVENANCE")


def test_physical_capability_record_needs_only_the_four_names():
    provenance = dataclasses.replace(PHYSICAL_PROVENANCE, layer_range=None, dtype=None, shapes="")
    check_put(PutCommand(content=physical(RecordType.CAPABILITY, provenance=provenance), blob=b"x"), LIMIT)


def test_reference_record_needs_no_provenance():
    check_put(PutCommand(content=content(evidence_class=EvidenceClass.REFERENCE), blob=b"x"), LIMIT)
    check_put(PutCommand(content=content(evidence_class=EvidenceClass.CONTRACT), blob=b"x"), LIMIT)


@pytest.mark.parametrize("layers", [LayerRange(3, 3), LayerRange(5, 2), LayerRange(-1, 2)])
def test_bad_layer_range_is_refused(layers):
    provenance = Provenance(layer_range=layers)
    error = refused(PutCommand(content=content(provenance=provenance), blob=b"x"))
    assert (error.field, error.reason) == ("record.provenance.layer_range", "INVALID_LAYER_RANGE")


@pytest.mark.parametrize("start,end,field", [
    (10, 10, "record.valid_until_unix_ns"),
    (10, 5, "record.valid_until_unix_ns"),
    (-1, 0, "record.valid_from_unix_ns"),
    (0, -3, "record.valid_until_unix_ns"),
])
def test_bad_validity_window_is_refused(start, end, field):
    error = refused(PutCommand(content=content(validity=window(start, end)), blob=b"x"))
    assert (error.field, error.reason) == (field, "INVALID_VALIDITY_WINDOW")


def test_open_ended_windows_are_accepted():
    for start, end in ((0, 0), (5, 0), (0, 5)):
        check_put(PutCommand(content=content(validity=window(start, end)), blob=b"x"), LIMIT)


@pytest.mark.parametrize("command,field,reason", [
    (PutCommand(content=content(), blob=b""), "blob", "EMPTY_BLOB"),
    (PutCommand(content=content(), blob=b"x", record_id="bad id!"), "record.record_id", "INVALID_RECORD_ID"),
    (PutCommand(content=content(), blob=b"x", record_id="-leading"), "record.record_id", "INVALID_RECORD_ID"),
    (PutCommand(content=content(labels=(("Bad Key", "v"),)), blob=b"x"), "record.labels", "INVALID_LABEL_KEY"),
    (PutCommand(content=content(subject="s" * 5000), blob=b"x"), "record.subject", "TOO_LONG"),
])
def test_bad_put_names_field(command, field, reason):
    error = refused(command)
    assert (error.field, error.reason) == (field, reason)


def test_revoke_needs_id_and_reason():
    with pytest.raises(InvalidField) as err:
        check_revoke(RevokeCommand("", "why"))
    assert err.value.field == "record_id"
    with pytest.raises(InvalidField) as err:
        check_revoke(RevokeCommand("rec-1", " "))
    assert err.value.field == "reason"


@pytest.mark.parametrize("value", ["abc", "sha256:" + "A" * 64, "sha256:" + "a" * 63, "md5:" + "a" * 64])
def test_malformed_digest_is_refused(value):
    with pytest.raises(InvalidField) as err:
        parse_sha256("expected", value, required=False)
    assert (err.value.field, err.value.reason) == ("expected", "INVALID_SHA256")


def test_digest_parses_to_bare_hex():
    assert parse_sha256("f", "sha256:" + "a" * 64, required=True) == "a" * 64
    assert parse_sha256("f", "", required=False) == ""
