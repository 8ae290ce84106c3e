"""Protobuf edge: enums are checked, round trips are exact, page tokens are opaque and checked."""

from __future__ import annotations

import pytest

from fornax.common.v1 import common_pb2
from fornax.evidence_registry.v1 import evidence_registry_pb2 as pb
from services.evidence_registry import convert
from services.evidence_registry.blobs import sha256_hex
from services.evidence_registry.domain import BlobRef, Record, RecordStatus, RecordType
from services.evidence_registry.errors import InvalidField
from tests.unit.evidence_registry.factories import T0, physical


def request(**record_fields) -> pb.PutRecordRequest:
    fields = {"type": pb.RECORD_TYPE_MEASUREMENT, "evidence_class": common_pb2.EVIDENCE_CLASS_REFERENCE}
    fields.update(record_fields)
    return pb.PutRecordRequest(request_id="r1", record=pb.Record(**fields), blob=b"data")


def refused(message: pb.PutRecordRequest) -> InvalidField:
    with pytest.raises(InvalidField) as err:
        convert.put_command_from_proto(message)
    return err.value


def test_record_round_trips_through_proto():
    record = Record("measurement-1", physical(), BlobRef(sha256_hex(b"d"), 1), RecordStatus.REVOKED, T0, "old")
    assert convert.record_from_proto(convert.record_to_proto(record)) == record


def test_put_request_converts():
    command = convert.put_command_from_proto(
        request(blob_sha256="sha256:" + sha256_hex(b"data"), labels={"b": "2", "a": "1"}))
    assert command.content.type is RecordType.MEASUREMENT
    assert command.stated_sha256_hex == sha256_hex(b"data")
    assert command.content.labels == (("a", "1"), ("b", "2"))
    assert command.request_id == "r1"


@pytest.mark.parametrize("fields,field,reason", [
    ({"type": pb.RECORD_TYPE_UNSPECIFIED}, "record.type", "UNSPECIFIED_ENUM"),
    ({"type": 42}, "record.type", "UNKNOWN_ENUM"),
    ({"evidence_class": common_pb2.EVIDENCE_CLASS_UNSPECIFIED}, "record.evidence_class", "UNSPECIFIED_ENUM"),
    ({"evidence_class": 9}, "record.evidence_class", "UNKNOWN_ENUM"),
    ({"status": pb.RECORD_STATUS_REVOKED}, "record.status", "STATUS_NOT_SETTABLE"),
    ({"created_unix_ns": 5}, "record.created_unix_ns", "OUTPUT_ONLY"),
    ({"blob_sha256": "deadbeef"}, "record.blob_sha256", "INVALID_SHA256"),
    ({"provenance": pb.Provenance(dtype=77)}, "record.provenance.dtype", "UNKNOWN_ENUM"),
])
def test_bad_put_fields_are_named(fields, field, reason):
    error = refused(request(**fields))
    assert (error.field, error.reason) == (field, reason)


def test_put_without_record_is_refused():
    with pytest.raises(InvalidField) as err:
        convert.put_command_from_proto(pb.PutRecordRequest(blob=b"x"))
    assert err.value.field == "record"


def test_resolve_expectation_enums_and_digests_are_checked():
    with pytest.raises(InvalidField) as err:
        convert.expectations_from_proto(pb.ResolveRecordsRequest(expectations=[
            pb.RecordExpectation(record_id="a", expected_type=pb.RECORD_TYPE_MODEL),
            pb.RecordExpectation(record_id="b")]))
    assert (err.value.field, err.value.reason) == ("expectations[1].expected_type", "UNSPECIFIED_ENUM")
    with pytest.raises(InvalidField) as err:
        convert.expectations_from_proto(pb.ResolveRecordsRequest(expectations=[
            pb.RecordExpectation(record_id="a", expected_type=pb.RECORD_TYPE_MODEL, expected_blob_sha256="x")]))
    assert err.value.field == "expectations[0].expected_blob_sha256"


def test_list_filters_accept_unspecified_but_not_unknown():
    query = convert.list_query_from_proto(pb.ListRecordsRequest())
    assert (query.type, query.evidence_class, query.status) == (None, None, None)
    with pytest.raises(InvalidField) as err:
        convert.list_query_from_proto(pb.ListRecordsRequest(status=7))
    assert err.value.field == "status"


@pytest.mark.parametrize("seq", [1, 17, 10**12])
def test_page_token_round_trips(seq):
    assert convert.decode_page_token(convert.encode_page_token(seq)) == seq


@pytest.mark.parametrize("token", ["garbage", "djE6", "djI6NQ==", "djE6LTM="])
def test_forged_page_token_is_refused(token):
    with pytest.raises(InvalidField) as err:
        convert.decode_page_token(token)
    assert (err.value.field, err.value.reason) == ("page_token", "INVALID_PAGE_TOKEN")


def test_plain_value_expectations_are_checked():
    from services.evidence_registry.client import expectation

    assert expectation("r", "route", "sha256:" + "a" * 64).expected_sha256_hex == "a" * 64
    assert expectation("r", RecordType.MODEL).expected_type is RecordType.MODEL
    with pytest.raises(InvalidField) as err:
        expectation("r", "routes")
    assert (err.value.field, err.value.reason) == ("type", "UNKNOWN_RECORD_TYPE")
    with pytest.raises(InvalidField) as err:
        expectation("r", "model", "abc")
    assert err.value.field == "sha256"


def test_resolution_answers_round_trip_and_contradictions_are_refused():
    from services.evidence_registry.domain import Expectation, Resolution, ResolutionReason, ResolveOutcome

    record = Record("m-1", physical(), BlobRef(sha256_hex(b"d"), 1), RecordStatus.ACTIVE, T0)
    outcome = ResolveOutcome((Resolution("m-1", None, "", record),
                              Resolution("x", ResolutionReason.NOT_FOUND, "no such record")))
    assert convert.resolve_outcome_from_proto(convert.resolve_outcome_to_proto(outcome)) == outcome
    request = convert.expectations_to_proto([Expectation("m-1", RecordType.MODEL, "b" * 64)], 7)
    assert convert.expectations_from_proto(request) == (Expectation("m-1", RecordType.MODEL, "b" * 64),)
    contradiction = pb.ResolveRecordsResponse(resolutions=[pb.Resolution(record_id="x", ok=True, reason="REVOKED")])
    with pytest.raises(InvalidField) as err:
        convert.resolve_outcome_from_proto(contradiction)
    assert err.value.reason == "INCONSISTENT_RESOLUTION"
    silent_failure = pb.ResolveRecordsResponse(resolutions=[pb.Resolution(record_id="x", ok=False)])
    with pytest.raises(InvalidField):
        convert.resolve_outcome_from_proto(silent_failure)


def test_resolve_instant_defaults_to_now_and_refuses_negative():
    assert convert.resolve_instant(pb.ResolveRecordsRequest(), 123) == 123
    assert convert.resolve_instant(pb.ResolveRecordsRequest(at_unix_ns=5), 123) == 5
    with pytest.raises(InvalidField) as err:
        convert.resolve_instant(pb.ResolveRecordsRequest(at_unix_ns=-1), 123)
    assert err.value.field == "at_unix_ns"
