"""The negotiated compact_meta form of BATCH and RESULT metadata (libs.fnx2.wire.compact)."""

import dataclasses
import struct

import numpy as np
import pytest

from apps.fnx2.fuzz import frame as fuzz_frame
from libs.fnx2.wire import compact
from libs.fnx2.wire.codec import PRELUDE, PRELUDE_BYTES, decode_frame, encode_frame
from libs.fnx2.wire.control import (
    EXT_COMPACT_META,
    EXT_LEASE_SEQUENCE,
    EXT_MULTI_INFLIGHT,
    EXT_TRACEPARENT,
    Credit,
)
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Phase, Result, SequenceResult, SequenceStatus, Timings
from libs.fnx2.wire.tensor import Tensor
from tests.unit.fnx2.factories import MANIFEST_HASH, REQ_A, REQ_B, batch, lease

TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def compact_frame(message, sequence_no: int = 0) -> bytes:
    return encode_frame(message, sequence_no, compact_meta=True).to_bytes()


def metadata_of(frame: bytes) -> bytes:
    meta_len = struct.unpack("!I", frame[12:16])[0]
    return frame[PRELUDE_BYTES:PRELUDE_BYTES + meta_len]


def with_metadata(frame: bytes, metadata: bytes) -> bytes:
    """The same frame with other metadata and a valid CRC32C."""
    fields = PRELUDE.unpack(frame[:PRELUDE_BYTES])
    payload = frame[PRELUDE_BYTES + fields[5]:]
    return fuzz_frame(fields[3], metadata, payload, fields[7])


def error_of(frame: bytes, **kwargs) -> Fnx2Error:
    with pytest.raises(Fnx2Error) as info:
        decode_frame(frame, **kwargs)
    return info.value


def result(tensor_rows: int = 2) -> Result:
    ok = SequenceResult(REQ_A, lease(REQ_A), 3, SequenceStatus.OK, 0, 2, 0, tensor_rows, 3, 4,
                        None, None, Timings(10, 20, 30, 40))
    failed = SequenceResult(REQ_B, lease(REQ_B), 3, SequenceStatus.FAILED, 2, 3, None, 0, 3, 3,
                            "FAILED", "backend said no", Timings(1, 2, 3, 4))
    tensor = Tensor.from_array("activation", "fp32", np.ones((tensor_rows, 4), np.float32))
    return Result("dddddddd-dddd-4ddd-8ddd-dddddddddddd", 7, MANIFEST_HASH, (ok, failed), tensor)


@pytest.mark.parametrize("phase,rows", [(Phase.PREFILL, (2, 3)), (Phase.DECODE, (1, 1))])
def test_batch_round_trips_and_decodes_to_what_json_decodes(phase, rows):
    source = batch(phase, rows, position=5 if phase is Phase.DECODE else 0)
    binary, plain = compact_frame(source, 9), encode_frame(source, 9).to_bytes()
    assert compact.is_compact(metadata_of(binary)) and metadata_of(plain).startswith(b"{")
    assert len(metadata_of(binary)) < len(metadata_of(plain))
    a, b = decode_frame(binary).message, decode_frame(plain).message
    assert a.batch == b.batch == source.batch
    assert (a.plan_id, a.plan_hash, a.manifest_hash, a.source_stage, a.destination_stage) == (
        b.plan_id, b.plan_hash, b.manifest_hash, b.source_stage, b.destination_stage)
    assert a.tensor.descriptor == b.tensor.descriptor
    assert np.array_equal(a.tensor.array, b.tensor.array)


def test_traceparent_travels_and_is_refused_unless_negotiated():
    source = batch()
    traced = type(source)(*[getattr(source, n) for n in (
        "plan_id", "plan_hash", "manifest_hash", "source_stage", "destination_stage", "batch",
        "tensor")], TRACEPARENT)
    frame = compact_frame(traced)
    assert decode_frame(frame).message.traceparent == TRACEPARENT
    negotiated = frozenset({EXT_COMPACT_META})
    assert error_of(frame, negotiated=negotiated).code is ErrorCode.METADATA
    assert decode_frame(frame, negotiated=negotiated | {EXT_TRACEPARENT}).message.traceparent == TRACEPARENT


def test_result_round_trips_with_errors_timings_and_tensor():
    source = result()
    decoded = decode_frame(compact_frame(source, 4)).message
    assert decoded.results == source.results
    assert (decoded.batch_id, decoded.batch_sequence_no, decoded.manifest_hash) == (
        source.batch_id, source.batch_sequence_no, source.manifest_hash)
    assert np.array_equal(decoded.tensor.array, source.tensor.array)


def test_a_result_without_output_rows_has_no_tensor():
    failed = result().results[1]
    source = Result("dddddddd-dddd-4ddd-8ddd-dddddddddddd", 7, MANIFEST_HASH, (failed,), None)
    decoded = decode_frame(compact_frame(source)).message
    assert decoded.tensor is None and decoded.results == (failed,)


def test_strings_the_compact_form_cannot_carry_fall_back_to_canonical_json():
    source = batch()
    unusual = source.batch.sequences[0]._replace(trace_id="tr\u00e4ce")
    odd = type(source)(*[getattr(source, n) for n in (
        "plan_id", "plan_hash", "manifest_hash", "source_stage", "destination_stage")],
        source.batch.__class__(*[getattr(source.batch, n) for n in (
            "batch_id", "batch_sequence_no", "phase", "input_row_count")],
            (unusual, source.batch.sequences[1])), source.tensor)
    frame = compact_frame(odd)
    assert metadata_of(frame).startswith(b"{")
    assert decode_frame(frame).message.batch.sequences[0].trace_id == "tr\u00e4ce"


def test_compact_metadata_is_refused_where_it_was_not_negotiated():
    frame = compact_frame(batch())
    assert error_of(frame, negotiated=frozenset()).code is ErrorCode.METADATA
    assert error_of(frame, allow_extensions=False).code is ErrorCode.METADATA
    assert error_of(compact_frame(result()), negotiated=frozenset()).code is ErrorCode.METADATA


def _patched(frame: bytes, offset: int, fmt: str, value: int) -> bytes:
    meta = bytearray(metadata_of(frame))
    struct.pack_into(fmt, meta, offset, value)
    return with_metadata(frame, bytes(meta))


# BATCH header offsets: kind 4, phase 5, tensor kind 6, dtype 7, rank 8, flags 9,
# source length 10, destination length 11, sequence count 12, input rows 16, dims 20/24,
# sequence_no 28, batch_sequence_no 36.
@pytest.mark.parametrize("offset,fmt,value", [
    (5, "<B", 2), (6, "<B", 3), (7, "<B", 4), (8, "<B", 3), (9, "<B", 2), (9, "<B", 4), (10, "<B", 0),
    (11, "<B", 200), (12, "<I", 0), (12, "<I", 3), (12, "<I", 5000),
])
def test_malformed_batch_headers_are_compact_metadata_errors(offset, fmt, value):
    frame = _patched(compact_frame(batch()), offset, fmt, value)
    assert error_of(frame).code is ErrorCode.COMPACT_METADATA


def test_truncated_extended_or_non_ascii_compact_metadata_is_refused():
    frame = compact_frame(batch())
    meta = metadata_of(frame)
    for broken in (meta[:20], meta[:-3], meta + b"xx", meta[:-1] + b"\x07"):
        assert error_of(with_metadata(frame, broken)).code is ErrorCode.COMPACT_METADATA
    bad_magic = b"FXC1" + bytes([9]) + meta[5:]
    assert error_of(with_metadata(frame, bad_magic)).code is ErrorCode.COMPACT_METADATA


def test_batch_rules_keep_their_2_0_codes_in_the_compact_form():
    table = compact.BATCH_HEADER.size + len(b"stage-0stage-1")
    frame = compact_frame(batch())
    # second slice starts at row 1 instead of 2: a gap/overlap in coverage
    assert error_of(_patched(frame, table + 74 + 40, "<I", 1)).code is ErrorCode.BATCH_CONTRACT
    # first slice with zero rows
    assert error_of(_patched(frame, table + 44, "<I", 0)).code is ErrorCode.BATCH_CONTRACT
    # both slices name the same request
    meta = bytearray(metadata_of(frame))
    meta[table + 74:table + 90] = meta[table:table + 16]
    assert error_of(with_metadata(frame, bytes(meta))).code is ErrorCode.BATCH_CONTRACT
    # a decode slice of two rows
    decode = compact_frame(batch(Phase.PREFILL, (2, 3)))
    assert error_of(_patched(decode, 5, "<B", 1)).code is ErrorCode.BATCH_CONTRACT
    # sequence_no differs from the prelude
    assert error_of(_patched(frame, 28, "<Q", 5)).code is ErrorCode.SEQUENCE
    # tensor dimensions that differ from the payload
    assert error_of(_patched(frame, 24, "<I", 8)).code is ErrorCode.TENSOR_CONTRACT


def test_result_rules_are_checked_over_the_whole_table():
    frame = compact_frame(result())
    item = compact.RESULT_HEADER.size
    step = compact.RESULT_ITEM_STRUCT.size
    # record offsets: status 40, output_row_count 54, kv_epoch_after 66, code length 106
    # ok sequence claims an error code: lengths no longer add up -> structure error
    assert error_of(_patched(frame, item + 106, "<B", 1)).code is ErrorCode.COMPACT_METADATA
    # unknown status
    assert error_of(_patched(frame, item + 40, "<B", 9)).code is ErrorCode.COMPACT_METADATA
    # failed sequence turned ok: ok without output rows
    assert error_of(_patched(frame, item + step + 40, "<B", 0)).code is ErrorCode.BATCH_RESULT
    # KV epoch moves backwards
    assert error_of(_patched(frame, item + 66, "<Q", 2)).code is ErrorCode.BATCH_RESULT
    # output rows that the tensor does not hold
    assert error_of(_patched(frame, item + 54, "<I", 1)).code is ErrorCode.BATCH_RESULT


def test_peek_names_dtype_and_byte_ranges_and_survives_garbage():
    source = batch(rows=(2, 3), dtype="fp16")
    meta = metadata_of(compact_frame(source))
    dtype, ranges = compact.peek(meta, 1)
    assert dtype.value == "fp16" and ranges == [(0, 16), (16, 40)]
    assert compact.peek(meta[:30], 1) is None and compact.peek(b"FXC1" + bytes(200), 1) is None


def numbered(source, numbers):
    """`source` with each slice carrying a lease_sequence (None: that slice carries none)."""
    slices = tuple(s._replace(lease_sequence=n)
                   for s, n in zip(source.batch.sequences, numbers, strict=True))
    return dataclasses.replace(source, batch=dataclasses.replace(source.batch, sequences=slices))


LEASE_NUMBERED = frozenset({EXT_COMPACT_META, EXT_LEASE_SEQUENCE})


def test_lease_sequences_travel_in_the_compact_form_and_decode_as_json_does():
    source = numbered(batch(), (7, 2**64 - 1))
    binary, plain = compact_frame(source, 4), encode_frame(source, 4).to_bytes()
    meta = metadata_of(binary)
    assert compact.is_compact(meta) and meta[9] == compact.FLAG_LEASE_SEQUENCE
    assert len(meta) == len(metadata_of(compact_frame(batch(), 4))) + 2 * 8
    a = decode_frame(binary, negotiated=LEASE_NUMBERED).message
    b = decode_frame(plain, negotiated=LEASE_NUMBERED).message
    assert a.batch == b.batch == source.batch
    assert [s.lease_sequence for s in a.batch.sequences] == [7, 2**64 - 1]
    # without lease numbers the flag stays clear and slices decode with none
    unnumbered = decode_frame(compact_frame(batch()), negotiated=LEASE_NUMBERED).message
    assert [s.lease_sequence for s in unnumbered.batch.sequences] == [None, None]


def test_lease_sequences_are_refused_where_not_negotiated_with_the_json_code():
    source = numbered(batch(), (7, 8))
    only_compact = frozenset({EXT_COMPACT_META})
    compact_error = error_of(compact_frame(source), negotiated=only_compact)
    json_error = error_of(encode_frame(source, 0).to_bytes(), negotiated=only_compact)
    assert compact_error.code is json_error.code is ErrorCode.BATCH_CONTRACT


def test_a_batch_numbered_on_some_slices_only_goes_as_json():
    source = numbered(batch(), (7, None))
    frame = compact_frame(source)
    assert metadata_of(frame).startswith(b"{")
    decoded = decode_frame(frame, negotiated=LEASE_NUMBERED).message
    assert [s.lease_sequence for s in decoded.batch.sequences] == [7, None]


def test_a_lease_sequence_column_that_does_not_add_up_is_compact_metadata():
    frame = compact_frame(numbered(batch(), (7, 8)))
    meta = metadata_of(frame)
    records_end = compact.BATCH_HEADER.size + len(b"stage-0stage-1") + 2 * compact.SLICE_STRUCT.size
    without_column = meta[:records_end] + meta[records_end + 16:]
    short_column = meta[:records_end + 8] + meta[records_end + 16:]
    for broken in (without_column, short_column):
        error = error_of(with_metadata(frame, broken), negotiated=LEASE_NUMBERED)
        assert error.code is ErrorCode.COMPACT_METADATA
    # the flag cleared with the column left in place: the lengths no longer add up
    cleared = error_of(_patched(frame, 9, "<B", 0), negotiated=LEASE_NUMBERED)
    assert cleared.code is ErrorCode.COMPACT_METADATA


CREDIT_CHANNEL = frozenset({EXT_COMPACT_META, EXT_MULTI_INFLIGHT})


@pytest.mark.parametrize("received", [None, 0, 41])
def test_credit_round_trips_in_80_bytes_and_decodes_to_what_json_decodes(received):
    credit = Credit(4, 2**64 - 1, 65536, 1024, 17, 1 << 40, 0, received)
    binary, plain = compact_frame(credit, 6), encode_frame(credit, 6).to_bytes()
    assert compact.is_compact(metadata_of(binary)) and len(metadata_of(binary)) == 80
    assert metadata_of(plain).startswith(b"{")
    assert decode_frame(binary, negotiated=CREDIT_CHANNEL).message == credit
    assert decode_frame(plain, negotiated=CREDIT_CHANNEL).message == credit


def test_compact_credit_is_refused_where_not_negotiated_and_batches_received_needs_multi_inflight():
    with_count = compact_frame(Credit(1, 2, 3, 4, 5, 6, 7, 8))
    assert error_of(with_count, negotiated=frozenset()).code is ErrorCode.METADATA
    only_compact = frozenset({EXT_COMPACT_META})
    assert error_of(with_count, negotiated=only_compact).code is ErrorCode.METADATA
    json_error = error_of(encode_frame(Credit(1, 2, 3, 4, 5, 6, 7, 8), 0).to_bytes(),
                          negotiated=only_compact)
    assert json_error.code is ErrorCode.METADATA
    plain = Credit(1, 2, 3, 4, 5, 6, 7)
    assert decode_frame(compact_frame(plain), negotiated=only_compact).message == plain


@pytest.mark.parametrize("offset,fmt,value", [
    (4, "<B", 1),  # the kind byte of a BATCH
    (5, "<B", 2),  # an unknown flag
    (6, "<H", 1),  # reserved
    (72, "<Q", 3),  # batches_received without its flag
])
def test_malformed_compact_credit_is_compact_metadata(offset, fmt, value):
    frame = _patched(compact_frame(Credit(1, 2, 3, 4, 5, 6, 7)), offset, fmt, value)
    assert error_of(frame, negotiated=CREDIT_CHANNEL).code is ErrorCode.COMPACT_METADATA


def test_compact_credit_of_the_wrong_length_or_sequence_is_refused():
    frame = compact_frame(Credit(1, 2, 3, 4, 5, 6, 7))
    meta = metadata_of(frame)
    for broken in (meta[:79], meta + b"\0"):
        assert error_of(with_metadata(frame, broken),
                        negotiated=CREDIT_CHANNEL).code is ErrorCode.COMPACT_METADATA
    assert error_of(_patched(frame, 8, "<Q", 9), negotiated=CREDIT_CHANNEL).code is ErrorCode.SEQUENCE
