"""Metadata values of the wrong JSON type, non-canonical floats and extension fields sent
before negotiation: each gets its specific FNX2 code, never another exception."""

import json

import pytest

from libs.fnx2.wire.codec import decode_frame
from libs.fnx2.wire.control import Ack, AckHello, Control, Credit
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import canonical_json
from libs.fnx2.wire.messages import Phase
from tests.unit.fnx2.factories import BINDING, batch, frame_bytes, reframe, split
from tests.unit.fnx2.test_codec_errors import _result

BATCH = frame_bytes(batch(), 3)
CONTROL_ID = "dddddddd-dddd-4ddd-8ddd-dddddddddddd"
WRONG_TYPES = [[], ["bf16"], {}, {"a": 1}, 1, 1.5, True, None]


def code_of(data: bytes, **kwargs) -> ErrorCode:
    with pytest.raises(Fnx2Error) as info:
        decode_frame(data, **kwargs)
    return info.value.code


def with_meta(frame: bytes, change) -> bytes:
    _, meta, _ = split(frame)
    change(meta)
    return reframe(frame, meta=meta)


@pytest.mark.parametrize("value", WRONG_TYPES)
def test_tensor_dtype_and_kind_of_any_other_type_are_tensor_contract(value):
    for field in ("dtype", "kind"):
        frame = with_meta(BATCH, lambda m, field=field: m["tensor"].__setitem__(field, value))
        assert code_of(frame) is ErrorCode.TENSOR_CONTRACT


@pytest.mark.parametrize("value", WRONG_TYPES)
def test_result_status_of_any_other_type_is_batch_result(value):
    def change(meta):
        meta["results"][0]["status"] = value
    assert code_of(with_meta(frame_bytes(_result(), 2), change)) is ErrorCode.BATCH_RESULT


@pytest.mark.parametrize("value", WRONG_TYPES)
def test_ack_operation_of_any_other_type_is_metadata(value):
    frame = frame_bytes(Ack("hello", CONTROL_ID, AckHello(BINDING)), 1)
    assert code_of(with_meta(frame, lambda m: m.__setitem__("operation", value))) is ErrorCode.METADATA


@pytest.mark.parametrize("versions", [[["a", "b"], [2, 0]], [[2.0, 0]], [[True, False], [2, 0]],
                                      [{}, [2, 0]], [[2, 0, 1]], "2.0", [[-1, 0], [2, 0]]])
def test_hello_versions_must_be_integer_pairs(versions):
    frame = frame_bytes(Control("hello", CONTROL_ID, BINDING, ((2, 0),)), 0)
    assert code_of(with_meta(frame, lambda m: m.__setitem__("supported_versions", versions))) is ErrorCode.METADATA


@pytest.mark.parametrize("value", WRONG_TYPES[:4])
def test_phase_and_sequences_of_another_type_are_batch_contract(value):
    for field in ("phase", "sequences"):
        frame = with_meta(BATCH, lambda m, field=field: m["batch"].__setitem__(field, value))
        assert code_of(frame) is ErrorCode.BATCH_CONTRACT


def test_exponent_floats_must_be_spelled_as_the_standard_library_does():
    _, meta, _ = split(BATCH)
    canonical = canonical_json(meta)
    assert json.dumps(1e16) == "1e+16"
    short = canonical.replace(b'"plan_hash"', b'"pad":1e16,"plan_hash"', 1)
    standard = canonical.replace(b'"plan_hash"', b'"pad":1e+16,"plan_hash"', 1)
    assert canonical_json(json.loads(short)) == standard  # byte-equal to json.dumps
    with pytest.raises(Fnx2Error, match="not canonical"):
        decode_frame(reframe(BATCH, meta=short))
    # the canonical spelling passes the canonical check and fails on the unknown field
    with pytest.raises(Fnx2Error, match="closed field set") as info:
        decode_frame(reframe(BATCH, meta=standard))
    assert info.value.code is ErrorCode.METADATA
    for value in (1e-7, 1.5e300, 123456789012345680.0):
        assert canonical_json({"v": value}) == json.dumps({"v": value}).replace(" ", "").encode()


def test_extension_fields_are_refused_until_negotiated():
    traced = with_meta(BATCH, lambda m: m.__setitem__("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"))
    assert code_of(traced, negotiated=frozenset()) is ErrorCode.METADATA
    assert code_of(traced, negotiated=frozenset({"multi_inflight"})) is ErrorCode.METADATA
    assert decode_frame(traced, negotiated=frozenset({"traceparent"})).message.traceparent
    credit = frame_bytes(Credit(1, 2, 3, 4, 5, 6, 7, batches_received=3), 4)
    assert code_of(credit, negotiated=frozenset()) is ErrorCode.METADATA
    assert decode_frame(credit, negotiated=frozenset({"multi_inflight"})).message.batches_received == 3
    # the offer itself is always readable by a peer that supports extensions
    offer = frame_bytes(Control("extensions", CONTROL_ID, BINDING, extensions=("timings",)), 2)
    assert decode_frame(offer, negotiated=frozenset()).message.extensions == ("timings",)


def test_decode_batches_with_wrong_types_in_slices_are_batch_contract():
    frame = frame_bytes(batch(Phase.DECODE, rows=(1, 1)), 5)
    for value in WRONG_TYPES[:4]:
        changed = with_meta(frame, lambda m, value=value: m["batch"]["sequences"][0].__setitem__(
            "request_id", value))
        assert code_of(changed) is ErrorCode.BATCH_CONTRACT
