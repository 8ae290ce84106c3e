"""One mutated frame for every frame-level FNX2 error code, in validation order."""

import numpy as np
import pytest

from libs.fnx2.wire.codec import CodecLimits, ExpectedBinding, decode_frame, encode_frame
from libs.fnx2.wire.control import ChannelBinding, Credit
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Phase, Result, SequenceResult, SequenceStatus, Timings
from libs.fnx2.wire.tensor import Tensor, float32_to_bf16
from tests.unit.fnx2.factories import (
    BINDING,
    GENERATION,
    MANIFEST_HASH,
    PLAN_ID,
    REQ_A,
    batch,
    frame_bytes,
    lease,
    reframe,
    split,
)

GOOD = frame_bytes(batch(), sequence_no=3)


def code_of(data: bytes, **kwargs) -> Fnx2Error:
    with pytest.raises(Fnx2Error) as info:
        decode_frame(data, **kwargs)
    return info.value


def meta_with(**changes):
    _, meta, _ = split(GOOD)
    meta.update(changes)
    return meta


@pytest.mark.parametrize("mutation", [
    {"magic": b"FNX1"}, {"major": 3}, {"minor": 1}, {"flags": 1}, {"reserved": 7}, {"kind": 9},
    {"kind": 0},
])
def test_abi_version_is_terminal(mutation):
    error = code_of(reframe(GOOD, **mutation))
    assert error.code is ErrorCode.ABI_VERSION and error.terminal


def test_frame_size_cases_are_terminal():
    assert code_of(GOOD[:-1]).code is ErrorCode.FRAME_SIZE
    assert code_of(GOOD + b"\0").code is ErrorCode.FRAME_SIZE
    assert code_of(GOOD[:20]).code is ErrorCode.FRAME_SIZE
    assert code_of(reframe(GOOD, meta_len=256 * 1024 + 1)).code is ErrorCode.FRAME_SIZE
    small = code_of(GOOD, limits=CodecLimits(max_payload_bytes=8))
    assert small.code is ErrorCode.FRAME_SIZE and small.terminal
    credit = frame_bytes(Credit(1, 2, 3, 4, 5, 6, 7))
    assert code_of(reframe(credit, payload=b"\0\0")).code is ErrorCode.FRAME_SIZE


def test_checksum_is_terminal_and_checked_before_metadata():
    corrupt = bytearray(GOOD)
    corrupt[-1] ^= 0x01
    error = code_of(bytes(corrupt))
    assert error.code is ErrorCode.CHECKSUM and error.terminal
    broken_json = bytearray(reframe(GOOD, meta=b"{not json"))
    broken_json[-1] ^= 0x01
    assert code_of(bytes(broken_json)).code is ErrorCode.CHECKSUM


@pytest.mark.parametrize("metadata", [
    b'{"sequence_no": 3}',                       # non-canonical spacing
    b'{"a":1,"a":1,"sequence_no":3}',            # duplicate key
    b'{"sequence_no":NaN}',                      # non-finite number
    b"[1,2]",                                    # not an object
    b"\xff\xfe",                                 # not UTF-8 JSON
])
def test_metadata_encoding_errors_are_recoverable(metadata):
    error = code_of(reframe(GOOD, meta=metadata, payload=b""))
    assert error.code is ErrorCode.METADATA and not error.terminal


def test_closed_field_sets_reject_unknown_and_missing_fields():
    assert code_of(reframe(GOOD, meta=meta_with(extra=1))).code is ErrorCode.METADATA
    _, meta, _ = split(GOOD)
    del meta["batch_digest"]
    assert code_of(reframe(GOOD, meta=meta)).code is ErrorCode.METADATA
    traced = reframe(GOOD, meta=meta_with(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"))
    assert decode_frame(traced).message.traceparent.startswith("00-")
    assert code_of(traced, allow_extensions=False).code is ErrorCode.METADATA


def test_sequence_number_must_match_prelude():
    error = code_of(reframe(GOOD, meta=meta_with(sequence_no=4)))
    assert error.code is ErrorCode.SEQUENCE and not error.terminal


def test_stale_plan_binding_is_checked_before_the_tensor():
    expected = ExpectedBinding(BINDING, source_stage="stage-0")
    assert decode_frame(GOOD, expected=expected).message.destination_stage == "stage-1"
    other = ExpectedBinding(ChannelBinding(PLAN_ID, "sha256:" + "d" * 64, MANIFEST_HASH,
                                           "stage-1", GENERATION))
    assert code_of(GOOD, expected=other).code is ErrorCode.STALE_PLAN
    wrong_tensor = reframe(GOOD, meta=meta_with(destination_stage="stage-9"), payload=b"\0")
    assert code_of(wrong_tensor, expected=expected).code is ErrorCode.STALE_PLAN
    assert code_of(GOOD, expected=ExpectedBinding(BINDING, source_stage="gateway")).code is (
        ErrorCode.STALE_PLAN)


def test_tensor_contract_errors():
    _, _, payload = split(GOOD)
    words = np.frombuffer(payload, dtype="<u2").copy()
    words[3] = 0x7F80  # +inf in bf16
    assert code_of(reframe(GOOD, payload=words.tobytes())).code is ErrorCode.TENSOR_CONTRACT
    words[3] = 0xFFC1  # a NaN
    assert code_of(reframe(GOOD, payload=words.tobytes())).code is ErrorCode.TENSOR_CONTRACT
    assert code_of(reframe(GOOD, payload=payload[:-2])).code is ErrorCode.TENSOR_CONTRACT
    _, meta, _ = split(GOOD)
    meta["tensor"]["dtype"] = "int32"
    assert code_of(reframe(GOOD, meta=meta)).code is ErrorCode.TENSOR_CONTRACT
    meta["tensor"]["dtype"], meta["tensor"]["layout"] = "bf16", "column_major"
    assert code_of(reframe(GOOD, meta=meta)).code is ErrorCode.TENSOR_CONTRACT


def test_batch_contract_errors():
    _, meta, _ = split(GOOD)
    meta["batch"]["sequences"][1]["input_row_start"] = 3  # gap
    assert code_of(reframe(GOOD, meta=meta)).code is ErrorCode.BATCH_CONTRACT
    assert code_of(reframe(GOOD, meta=meta_with(batch_digest="sha256:" + "0" * 64))).code is (
        ErrorCode.BATCH_CONTRACT)
    decode = frame_bytes(batch(Phase.DECODE, rows=(1, 1)))
    _, meta, _ = split(decode)
    meta["batch"]["sequences"][0]["input_row_count"] = 2
    meta["batch"]["input_row_count"] = 3
    assert code_of(reframe(decode, meta=meta)).code is ErrorCode.BATCH_CONTRACT


def _result(status=SequenceStatus.OK, output_row_start=0):
    item = SequenceResult(REQ_A, lease(REQ_A), 0, status, 0, 2, output_row_start, 2, 0, 1,
                          None, None, Timings())
    tensor = Tensor.from_array("activation", "bf16", float32_to_bf16(np.ones((2, 4), np.float32)))
    return Result("dddddddd-dddd-4ddd-8ddd-dddddddddddd", 0, MANIFEST_HASH, (item,), tensor)


def test_batch_result_errors():
    good = frame_bytes(_result())
    assert decode_frame(good).message.results[0].status is SequenceStatus.OK
    _, meta, _ = split(good)
    meta["results"][0]["output_row_start"] = 1
    assert code_of(reframe(good, meta=meta)).code is ErrorCode.BATCH_RESULT
    meta["results"][0].update(output_row_start=0, status="failed")
    assert code_of(reframe(good, meta=meta)).code is ErrorCode.BATCH_RESULT
    with pytest.raises(Fnx2Error) as info:
        frame_bytes(_result(output_row_start=1))
    assert info.value.code is ErrorCode.BATCH_RESULT


def test_result_must_correlate_with_its_batch():
    source = batch(rows=(2,), requests=(REQ_A,))
    result = _result()
    with pytest.raises(Fnx2Error) as info:
        result.check_against(source)
    assert info.value.code is ErrorCode.BATCH_RESULT


def test_encoder_refuses_non_finite_values():
    values = np.ones((5, 4), np.float32)
    values[2, 1] = np.inf
    with pytest.raises(Fnx2Error) as info:
        Tensor.from_array("activation", "fp32", values)
    assert info.value.code is ErrorCode.TENSOR_CONTRACT
    fp16 = np.ones((5, 4), np.float16)
    fp16[4, 3] = np.nan
    with pytest.raises(Fnx2Error):
        Tensor.from_array("logits", "fp16", fp16)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_values_are_caught_at_build_and_at_decode(dtype, bad):
    from libs.fnx2.wire.tensor import STORAGE, DType, TensorDescriptor, TensorKind

    values = np.linspace(-60000, 60000, 40, dtype=np.float32).reshape(10, 4)
    values[7, 2] = bad
    with pytest.raises(Fnx2Error):
        Tensor.from_array("activation", dtype, values)
    storage = (float32_to_bf16(values) if dtype == "bf16"
               else values.astype(STORAGE[DType(dtype)]))
    raw = Tensor(TensorDescriptor(TensorKind.ACTIVATION, DType(dtype), (10, 4)), storage)
    message = batch(rows=(4, 6), dtype=dtype)
    import dataclasses

    smuggled = dataclasses.replace(message, tensor=raw)
    with pytest.raises(Fnx2Error) as info:
        encode_frame(smuggled, 0, check_finite=True)
    assert info.value.code is ErrorCode.TENSOR_CONTRACT
    assert code_of(encode_frame(smuggled, 0).to_bytes()).code is ErrorCode.TENSOR_CONTRACT


def test_payload_crc_computed_ahead_gives_the_same_frame():
    from libs.fnx2.wire.codec import payload_crc
    from libs.fnx2.wire.crc import crc32c_combine
    from libs.fnx2.wire.tensor import crc32c

    message = batch(rows=(40, 24), width=300, dtype="fp32")
    ahead = encode_frame(message, 9, known_payload_crc=payload_crc(message)).to_bytes()
    assert ahead == encode_frame(message, 9).to_bytes()
    for a, b in [(b"", b""), (b"x", b""), (b"", b"yz"), (b"meta" * 99, bytes(range(256)) * 5)]:
        assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
