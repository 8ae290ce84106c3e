"""One validator for the sequence tables of both metadata encodings (libs.fnx2.wire.columns)."""

import dataclasses

import numpy as np
import pytest

from apps.fnx2.fuzz import frame as raw_frame
from libs.fnx2.wire import compact
from libs.fnx2.wire.codec import decode_frame
from libs.fnx2.wire.columns import check_result_columns, check_slice_columns
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import canonical_json
from libs.fnx2.wire.messages import Batch, Phase, Result, SequenceResult, SequenceStatus, Timings
from libs.fnx2.wire.tensor import Tensor
from tests.unit.fnx2.factories import MANIFEST_HASH, REQ_A, REQ_B, batch, lease


@pytest.mark.parametrize("starts,counts,ids,phase,rows,why", [
    ((), (), (), Phase.PREFILL, 0, "batch has no sequences"),
    ((0, 2), (2, 0), ("a", "b"), Phase.PREFILL, 2, "input_row_count must be at least 1"),
    ((0, 1), (1, 2), ("a", "b"), Phase.DECODE, 3, "a decode slice is exactly one row"),
    ((0, 3), (2, 3), ("a", "b"), Phase.PREFILL, 6, "without gaps or overlap"),
    ((1,), (2,), ("a",), Phase.PREFILL, 3, "without gaps or overlap"),
    ((0, 2), (2, 3), ("a", "b"), Phase.PREFILL, 6, "every input row exactly once"),
    ((0, 2), (2, 3), ("a", "a"), Phase.PREFILL, 5, "more than once"),
])
def test_each_slice_rule_is_a_batch_contract_error(starts, counts, ids, phase, rows, why):
    with pytest.raises(Fnx2Error) as info:
        check_slice_columns(starts, counts, ids, phase, rows)
    assert info.value.code is ErrorCode.BATCH_CONTRACT and why in info.value.message


def test_a_covering_table_passes():
    check_slice_columns((0, 2), (2, 3), (b"a", b"b"), Phase.PREFILL, 5)
    check_slice_columns((0, 1, 2), (1, 1, 1), ("a", "b", "c"), Phase.DECODE, 3)


# Columns: ok, input rows, has output, output rows, has error, epoch before, epoch after.
GOOD = ((True, False), (2, 3), (1, 0), (2, 0), (0, 6), (3, 3), (4, 3))


@pytest.mark.parametrize("column,value,why", [
    (1, (0, 3), "input_row_count must be at least 1"),
    (6, (2, 3), "cannot move backwards"),
    (4, (6, 6), "an ok sequence has output rows and no error"),
    (3, (0, 0), "an ok sequence has output rows and no error"),
    (2, (0, 0), "an ok sequence has output rows and no error"),
    (3, (2, 1), "a failed sequence"),
    (4, (0, 0), "a failed sequence"),
    (6, (4, 4), "a failed sequence"),
])
def test_each_result_rule_is_a_batch_result_error(column, value, why):
    check_result_columns(*GOOD)
    columns = list(GOOD)
    columns[column] = value
    with pytest.raises(Fnx2Error) as info:
        check_result_columns(*columns)
    assert info.value.code is ErrorCode.BATCH_RESULT and why in info.value.message


def unchecked_frames(message: Batch | Result) -> tuple[bytes, bytes]:
    """(JSON, compact) frames of `message`, built without the encoders' own checks."""
    if isinstance(message, Batch):
        as_json, as_compact = message.encode_metadata(0), compact.encode_batch(message, 0)
    else:
        meta = message.to_meta()
        meta["sequence_no"] = 0
        as_json, as_compact = canonical_json(meta), compact.encode_result(message, 0)
    assert as_compact is not None
    payload = bytes(message.tensor.payload()) if message.tensor is not None else b""
    return (raw_frame(message.KIND, as_json, payload, 0), raw_frame(message.KIND, as_compact, payload, 0))


def refusals(message: Batch | Result) -> tuple[tuple[ErrorCode, str], tuple[ErrorCode, str]]:
    out = []
    for frame in unchecked_frames(message):
        with pytest.raises(Fnx2Error) as info:
            decode_frame(frame)
        out.append((info.value.code, info.value.message))
    return out[0], out[1]


def _shifted(source: Batch, index: int, start: int) -> Batch:
    slices = list(source.batch.sequences)
    slices[index] = slices[index]._replace(input_row_start=start)
    return dataclasses.replace(source, batch=dataclasses.replace(source.batch, sequences=tuple(slices)))


@pytest.mark.parametrize("bad", [
    batch(requests=(REQ_A, REQ_A), leases=(lease(REQ_A), lease(REQ_B))),  # a request named twice
    _shifted(batch(), 1, 1),  # overlapping slices
    batch(Phase.DECODE, (2, 1), position=5),  # a decode slice of two rows
], ids=["duplicate", "overlap", "decode-rows"])
def test_both_encodings_refuse_a_bad_slice_table_alike(bad):
    as_json, as_compact = refusals(bad)
    assert as_json == as_compact and as_json[0] is ErrorCode.BATCH_CONTRACT


def _result(ok: SequenceResult, failed: SequenceResult) -> Result:
    tensor = Tensor.from_array("activation", "fp32", np.ones((2, 4), np.float32))
    return Result("dddddddd-dddd-4ddd-8ddd-dddddddddddd", 7, MANIFEST_HASH, (ok, failed), tensor)


OK = SequenceResult(REQ_A, lease(REQ_A), 3, SequenceStatus.OK, 0, 2, 0, 2, 3, 4, None, None, Timings())
FAILED = SequenceResult(REQ_B, lease(REQ_B), 3, SequenceStatus.FAILED, 2, 3, None, 0, 3, 3,
                        "FAILED", "backend said no", Timings())


@pytest.mark.parametrize("bad", [
    _result(OK._replace(kv_epoch_after=2), FAILED),  # an epoch moving backwards
    _result(OK._replace(error_code="FAILED", error_message="but ok"), FAILED),  # ok with an error
    _result(OK, FAILED._replace(output_row_count=1)),  # failed with output rows
    _result(OK, FAILED._replace(kv_epoch_after=4)),  # failed with its KV epoch moved
], ids=["backwards", "ok-error", "failed-rows", "failed-epoch"])
def test_both_encodings_refuse_a_bad_result_table_alike(bad):
    as_json, as_compact = refusals(bad)
    assert as_json == as_compact and as_json[0] is ErrorCode.BATCH_RESULT
