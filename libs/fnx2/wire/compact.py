"""The negotiated `compact_meta` extension: fixed-layout binary metadata for BATCH and RESULT.

Plain FNX2 2.0 metadata is canonical JSON; once both ends negotiated `compact_meta`, BATCH
and RESULT metadata may instead be this little-endian binary form (it starts with the
magic `FXC1`, which no JSON object does). The frame prelude, the CRC32C over
metadata ‖ payload and the payload are unchanged. The per-sequence fields sit in one
fixed-size record each; the whole table is unpacked by one C call into columns and each
rule is checked once per column (min/max/accumulate), not per sequence object; only then
are the typed messages built.

Layout (see libs/fnx2/README.md for the table):
- BATCH: header (`BATCH_HEADER`), source and destination stage ids, the traceparent when
  flag bit 0 is set, then one `SLICE` record per sequence, then (flag bit 1, the negotiated
  `lease_sequence` extension) one little-endian uint64 lease number per sequence, then the
  sequences' trace and span ids back to back.
- RESULT: header (`RESULT_HEADER`), one `RESULT_ITEM` record per sequence, then the error
  codes and messages back to back.
- CREDIT: one fixed 80-byte record (`CREDIT_RECORD`): the credit vector, and
  `batches_received` when flag bit 0 is set (the negotiated `multi_inflight` extension).

Anything the compact form cannot carry (a non-printable-ASCII string) makes the encoder
return None, and the frame goes out as canonical JSON, which a compact peer still reads.
A malformed compact header or table is `COMPACT_METADATA` (recoverable: the frame length is
known, so the channel stays aligned); broken FNX2 rules keep their 2.0 codes.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable

from libs.fnx2.wire.columns import check_result_columns, check_slice_columns
from libs.fnx2.wire.control import Credit
from libs.fnx2.wire.errors import MAX_ERROR_CODE_CHARS, MAX_ERROR_MESSAGE_CHARS, ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import (
    MAX_ID_CHARS,
    MAX_SEQUENCES_PER_BATCH,
    TRACEPARENT_CHARS,
    Batch,
    BatchDescriptor,
    Kind,
    Phase,
    Result,
    SequenceResult,
    SequenceSlice,
    SequenceStatus,
    Timings,
)
from libs.fnx2.wire.tensor import DType, Tensor, TensorDescriptor, TensorKind

MAGIC = b"FXC1"
MAX_RESULTS_PER_FRAME = 4096

BATCH_HEADER = struct.Struct("<4sBBBBBBBBIIIIQQ16s16s32s32s")
RESULT_HEADER = struct.Struct("<4sBBBBBBHIIIQQ16s32s")
# One record per sequence (74 bytes): request_id, execution_lease_id (16-byte UUIDs),
# request_sequence_no Q, input_row_start I, input_row_count I, token_position_start Q,
# kv_epoch Q, deadline_budget_ns Q, trace_id length B, span_id length B.
SLICE = "16s16sQIIQQQBB"
SLICE_STRUCT = struct.Struct("<" + SLICE)
# One record per sequence result (109 bytes): request_id, execution_lease_id, request_sequence_no Q,
# status B, has_output B, input_row_start I, input_row_count I, output_row_start I,
# output_row_count I, kv_epoch_before Q, kv_epoch_after Q, timings queue/execute/pack/unpack
# 4Q, error code length B, error message length H.
RESULT_ITEM = "16s16sQBBIIIIQQQQQQBH"
RESULT_ITEM_STRUCT = struct.Struct("<" + RESULT_ITEM)
# CREDIT (80 bytes): magic, kind, flags (bit 0: batches_received present), reserved H,
# sequence_no, frames, payload_bytes, rows, sequences, live_requests, kv_bytes,
# replay_bytes, batches_received (0 without flag bit 0), each a uint64.
CREDIT_RECORD = struct.Struct("<4sBBHQQQQQQQQQ")
FLAG_BATCHES_RECEIVED = 1
FLAG_TRACEPARENT = 1
FLAG_LEASE_SEQUENCE = 2  # a uint64 lease_sequence column follows the slice records
_BATCH_FLAGS = FLAG_TRACEPARENT | FLAG_LEASE_SEQUENCE
LEASE_SEQUENCE_BYTES = 8

KINDS = (TensorKind.TOKEN_IDS, TensorKind.ACTIVATION, TensorKind.LOGITS)
DTYPES = (DType.INT32, DType.BF16, DType.FP16, DType.FP32)
PHASES = (Phase.PREFILL, Phase.DECODE)
STATUSES = (SequenceStatus.OK, SequenceStatus.CANCELLED, SequenceStatus.DEADLINE,
            SequenceStatus.REJECTED, SequenceStatus.FAILED)
_KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(DTYPES)}
_STATUS_CODE = {status: code for code, status in enumerate(STATUSES)}
_OK_CODE = _STATUS_CODE[SequenceStatus.OK]
_HASH_PREFIX = "sha256:"


def is_compact(metadata: bytes | memoryview) -> bool:
    return bytes(metadata[:4]) == MAGIC


def _fail(why: str) -> Fnx2Error:
    return Fnx2Error(ErrorCode.COMPACT_METADATA, why)


# -- small conversions ---------------------------------------------------------------------
# Request and lease ids repeat on every decode step of a request: their two spellings are
# cached (bounded), so a steady decode stream converts each id once.
@functools.lru_cache(maxsize=16384)
def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@functools.lru_cache(maxsize=16384)
def _uuid_raw(text: str) -> bytes:
    return bytes.fromhex(text.replace("-", ""))


@functools.lru_cache(maxsize=64)
def _hash_raw(text: str) -> bytes:
    return bytes.fromhex(text[len(_HASH_PREFIX):])


@functools.lru_cache(maxsize=64)
def _hash_text(raw: bytes) -> str:
    return _HASH_PREFIX + raw.hex()


_PRINTABLE = re.compile(rb"[\x20-\x7e]*")


@functools.lru_cache(maxsize=16384)  # stage, trace and span ids repeat on every step
def _printable(text: str, limit: int) -> bytes | None:
    """ASCII bytes of a non-empty printable string within `limit`, or None."""
    if not text or len(text) > limit or not text.isascii() or not text.isprintable():
        return None
    return text.encode("ascii")


def _check_printable(area: bytes) -> None:
    if _PRINTABLE.fullmatch(area) is None:
        raise _fail("strings must be printable ASCII")


def _tensor_fields(descriptor: TensorDescriptor) -> tuple[int, int, int, int, int]:
    shape = descriptor.shape
    return (_KIND_CODE[descriptor.kind], _DTYPE_CODE[descriptor.dtype], len(shape), shape[0],
            shape[1] if len(shape) == 2 else 0)


def _descriptor(kind: int, dtype: int, rank: int, dim0: int, dim1: int) -> TensorDescriptor:
    if kind >= len(KINDS) or dtype >= len(DTYPES) or rank not in (1, 2):
        raise _fail("unknown tensor kind, dtype or rank")
    if rank == 1 and dim1:
        raise _fail("a rank-1 tensor has no second dimension")
    return TensorDescriptor(KINDS[kind], DTYPES[dtype], (dim0,) if rank == 1 else (dim0, dim1))


def payload_dtype(metadata: bytes, kind: int) -> DType | None:
    """The payload dtype a compact header names (not validated yet), or None."""
    try:
        if kind == Kind.RESULT:
            _, _, has_tensor, _, dtype, *_rest = RESULT_HEADER.unpack_from(metadata)
            if not has_tensor:
                return None
        else:
            _, _, _, _, dtype, *_rest = BATCH_HEADER.unpack_from(metadata)
    except struct.error:
        return None
    return DTYPES[dtype] if dtype < len(DTYPES) else None


def peek(metadata: bytes | memoryview, kind: int) -> tuple[DType, list[tuple[int, int]]] | None:
    """(payload dtype, each sequence's payload byte range) from a compact header that has
    not been validated yet, for checks computed while the payload arrives; None when the
    header does not parse. Only an optimisation: the decoder validates everything."""
    try:
        if kind == Kind.RESULT:
            (_, _, has_tensor, tkind, dtype, rank, _, _, _, dim0, dim1, *_rest) = \
                RESULT_HEADER.unpack_from(metadata)
            descriptor = _descriptor(tkind, dtype, rank, dim0, dim1) if has_tensor else None
            return (descriptor.dtype, []) if descriptor is not None else None
        (_, _, _, tkind, dtype, rank, flags, src, dst, count, _, dim0, dim1,
         *_rest) = BATCH_HEADER.unpack_from(metadata)
        descriptor = _descriptor(tkind, dtype, rank, dim0, dim1)
        if not 0 < count <= MAX_SEQUENCES_PER_BATCH:
            return None
        offset = BATCH_HEADER.size + src + dst + (TRACEPARENT_CHARS if flags & FLAG_TRACEPARENT else 0)
        records = list(SLICE_STRUCT.iter_unpack(metadata[offset:offset + count * SLICE_STRUCT.size]))
    except (struct.error, Fnx2Error):
        return None
    row_bytes = descriptor.row_bytes
    return descriptor.dtype, [(r[3] * row_bytes, (r[3] + r[4]) * row_bytes) for r in records]


# -- BATCH ---------------------------------------------------------------------------------
def encode_batch(batch: Batch, sequence_no: int) -> bytes | None:
    """Compact BATCH metadata, or None when the form cannot carry the batch (use JSON): a
    string that is not printable ASCII, or lease numbers on some slices but not on all."""
    numbered = [s.lease_sequence for s in batch.batch.sequences if s.lease_sequence is not None]
    if numbered and len(numbered) != len(batch.batch.sequences):
        return None
    source = _printable(batch.source_stage, MAX_ID_CHARS)
    destination = _printable(batch.destination_stage, MAX_ID_CHARS)
    traceparent = b""
    if batch.traceparent is not None:
        traceparent = _printable(batch.traceparent, TRACEPARENT_CHARS) or b""
        if len(traceparent) != TRACEPARENT_CHARS:
            return None
    if source is None or destination is None:
        return None
    d = batch.batch
    records: list[bytes] = []
    strings: list[bytes] = []
    for s in d.sequences:
        trace, span = _printable(s.trace_id, MAX_ID_CHARS), _printable(s.span_id, MAX_ID_CHARS)
        if trace is None or span is None:
            return None
        strings += (trace, span)
        records.append(SLICE_STRUCT.pack(
            _uuid_raw(s.request_id), _uuid_raw(s.execution_lease_id), s.request_sequence_no,
            s.input_row_start, s.input_row_count, s.token_position_start, s.kv_epoch,
            s.deadline_budget_ns, len(trace), len(span)))
    tkind, dtype, rank, dim0, dim1 = _tensor_fields(batch.tensor.descriptor)
    header = BATCH_HEADER.pack(
        MAGIC, Kind.BATCH, PHASES.index(d.phase), tkind, dtype, rank,
        (FLAG_TRACEPARENT if traceparent else 0) | (FLAG_LEASE_SEQUENCE if numbered else 0),
        len(source), len(destination), len(d.sequences),
        d.input_row_count, dim0, dim1, sequence_no, d.batch_sequence_no, _uuid_raw(d.batch_id),
        _uuid_raw(batch.plan_id), _hash_raw(batch.plan_hash), _hash_raw(batch.manifest_hash))
    column = struct.pack(f"<{len(numbered)}Q", *numbered) if numbered else b""
    return b"".join((header, source, destination, traceparent, *records, column, *strings))


# attach(plan_id, plan_hash, manifest_hash, source, destination, descriptor) -> Tensor:
# the caller's binding check (step 3) and the payload as a tensor (step 4).
Attach = Callable[[str, str, str, str, str, TensorDescriptor], Tensor]


def decode_batch(metadata: bytes, sequence_no: int, attach: Attach,
                 lease_sequence: bool = True) -> Batch:
    """Structure (step 2), then `attach` (steps 3-4), then slice coverage (step 5), each
    checked once over the whole sequence table (columns of one struct unpack).
    `lease_sequence`: the channel negotiated the extension, so slices may carry lease
    numbers; otherwise a numbered batch is BATCH_CONTRACT, as the unknown JSON field is."""
    if len(metadata) < BATCH_HEADER.size:
        raise _fail("BATCH header is truncated")
    (magic, kind, phase, tkind, dtype, rank, flags, src_len, dst_len, count, input_rows, dim0,
     dim1, seq, batch_seq, batch_id, plan_id, plan_hash, manifest_hash) = BATCH_HEADER.unpack_from(metadata)
    _check_batch_header(magic, kind, phase, flags, src_len, dst_len, count)
    if seq != sequence_no:
        raise Fnx2Error(ErrorCode.SEQUENCE, "metadata sequence_no differs from the prelude")
    descriptor = _descriptor(tkind, dtype, rank, dim0, dim1)
    offset = BATCH_HEADER.size
    names_end = offset + src_len + dst_len
    trace_end = names_end + (TRACEPARENT_CHARS if flags & FLAG_TRACEPARENT else 0)
    records_end = trace_end + count * SLICE_STRUCT.size
    numbered = bool(flags & FLAG_LEASE_SEQUENCE)
    table_end = records_end + (count * LEASE_SEQUENCE_BYTES if numbered else 0)
    if len(metadata) < table_end:
        raise _fail("BATCH sequence table is truncated")
    records = list(SLICE_STRUCT.iter_unpack(metadata[trace_end:records_end]))
    columns = tuple(zip(*records, strict=True))
    request_ids, trace_lens, span_lens = columns[0], columns[8], columns[9]
    if min(trace_lens) < 1 or min(span_lens) < 1 or max(trace_lens) > MAX_ID_CHARS \
            or max(span_lens) > MAX_ID_CHARS:
        raise _fail("trace and span ids must be 1..128 characters")
    if len(metadata) != table_end + sum(trace_lens) + sum(span_lens):
        raise _fail("BATCH metadata length differs from its header and table")
    _check_printable(metadata[offset:trace_end])
    area = metadata[table_end:]
    _check_printable(area)
    names = metadata[offset:names_end].decode("ascii")
    plan = (_uuid_text(plan_id), _hash_text(plan_hash), _hash_text(manifest_hash))
    tensor = attach(*plan, names[:src_len], names[src_len:], descriptor)
    if numbered and not lease_sequence:  # where the JSON form refuses the unknown field
        raise Fnx2Error(ErrorCode.BATCH_CONTRACT, "lease_sequence was not negotiated on this channel")
    check_slice_columns(columns[3], columns[4], request_ids, PHASES[phase], input_rows)
    if descriptor.rows != input_rows:
        raise Fnx2Error(ErrorCode.BATCH_CONTRACT, "tensor rows differ from input_row_count")
    slices = _slices(records, area.decode("ascii"),
                     struct.unpack_from(f"<{count}Q", metadata, records_end) if numbered else None)
    traceparent = metadata[names_end:trace_end].decode("ascii") or None
    return Batch(*plan, names[:src_len], names[src_len:],
                 BatchDescriptor(_uuid_text(batch_id), batch_seq, PHASES[phase], input_rows, slices),
                 tensor, traceparent)


def _check_batch_header(magic: int, kind: int, phase: int, flags: int, src_len: int, dst_len: int,
                        count: int) -> None:
    """Step 2 for the fixed header fields: magic, kind, phase, flags and the bounded counts."""
    if magic != MAGIC or kind != Kind.BATCH:
        raise _fail("not a compact BATCH header")
    if phase >= len(PHASES) or flags & ~_BATCH_FLAGS:
        raise _fail("unknown phase or flags")
    if not (0 < src_len <= MAX_ID_CHARS and 0 < dst_len <= MAX_ID_CHARS):
        raise _fail("stage ids must be 1..128 characters")
    if not 0 < count <= MAX_SEQUENCES_PER_BATCH:
        raise _fail("sequence count out of range")


def _slices(records: list[tuple], text: str, lease_numbers: tuple[int, ...] | None
            ) -> tuple[SequenceSlice, ...]:
    """The typed slices of a validated table; trace and span ids are cut from `text` in
    record order."""
    uuid_text, make, slices, cut = _uuid_text, SequenceSlice._make, [], 0
    for i, (rid, lease, rsn, start, rows, position, epoch, budget, trace_len, span_len) \
            in enumerate(records):
        trace_end = cut + trace_len
        span_end = trace_end + span_len
        slices.append(make((uuid_text(rid), rsn, start, rows, position, epoch, budget,
                            uuid_text(lease), text[cut:trace_end], text[trace_end:span_end],
                            None if lease_numbers is None else lease_numbers[i])))
        cut = span_end
    return tuple(slices)


# -- RESULT --------------------------------------------------------------------------------
def encode_result(result: Result, sequence_no: int) -> bytes | None:
    records: list[bytes] = []
    strings: list[bytes] = []
    for r in result.results:
        code_len = message_len = 0
        if r.error_code is not None:
            code = _printable(r.error_code[:MAX_ERROR_CODE_CHARS], MAX_ERROR_CODE_CHARS)
            message = _printable((r.error_message or r.error_code)[:MAX_ERROR_MESSAGE_CHARS],
                                 MAX_ERROR_MESSAGE_CHARS)
            if code is None or message is None:
                return None
            strings += (code, message)
            code_len, message_len = len(code), len(message)
        t = r.timings
        has_output = r.output_row_start is not None
        records.append(RESULT_ITEM_STRUCT.pack(
            _uuid_raw(r.request_id), _uuid_raw(r.execution_lease_id), r.request_sequence_no,
            _STATUS_CODE[r.status], has_output, r.input_row_start, r.input_row_count,
            r.output_row_start if has_output else 0, r.output_row_count, r.kv_epoch_before,
            r.kv_epoch_after, t.queue_ns, t.execute_ns, t.pack_ns, t.unpack_ns, code_len,
            message_len))
    tensor = result.tensor
    tkind, dtype, rank, dim0, dim1 = (_tensor_fields(tensor.descriptor) if tensor is not None
                                      else (0, 0, 0, 0, 0))
    header = RESULT_HEADER.pack(
        MAGIC, Kind.RESULT, tensor is not None, tkind, dtype, rank, 0, 0, len(result.results),
        dim0, dim1, sequence_no, result.batch_sequence_no, _uuid_raw(result.batch_id),
        _hash_raw(result.manifest_hash))
    return b"".join((header, *records, *strings))


def decode_result(metadata: bytes, sequence_no: int,
                  attach: Callable[[TensorDescriptor | None], Tensor | None]) -> Result:
    """Structure, then `attach` (the payload as a tensor, or None without one), then each
    sequence result's rules over the table's columns."""
    if len(metadata) < RESULT_HEADER.size:
        raise _fail("RESULT header is truncated")
    (magic, kind, has_tensor, tkind, dtype, rank, pad, pad2, count, dim0, dim1, seq, batch_seq,
     batch_id, manifest_hash) = RESULT_HEADER.unpack_from(metadata)
    if magic != MAGIC or kind != Kind.RESULT:
        raise _fail("not a compact RESULT header")
    if pad or pad2 or has_tensor > 1 or (not has_tensor and (tkind or dtype or rank or dim0 or dim1)):
        raise _fail("reserved RESULT header fields must be zero")
    if not 0 < count <= MAX_RESULTS_PER_FRAME:
        raise _fail("result count out of range")
    if seq != sequence_no:
        raise Fnx2Error(ErrorCode.SEQUENCE, "metadata sequence_no differs from the prelude")
    descriptor = _descriptor(tkind, dtype, rank, dim0, dim1) if has_tensor else None
    table_end = RESULT_HEADER.size + count * RESULT_ITEM_STRUCT.size
    if len(metadata) < table_end:
        raise _fail("RESULT table is truncated")
    records = list(RESULT_ITEM_STRUCT.iter_unpack(metadata[RESULT_HEADER.size:table_end]))
    columns = tuple(zip(*records, strict=True))
    code_lens, message_lens = columns[15], columns[16]
    if len(metadata) != table_end + sum(code_lens) + sum(message_lens):
        raise _fail("RESULT metadata length differs from its header and table")
    area = metadata[table_end:]
    _check_printable(area)
    tensor = attach(descriptor)
    _check_items(columns[3], columns[4], columns[6:11], code_lens, message_lens)
    text = area.decode("ascii")
    uuid_text, make, items, cut = _uuid_text, SequenceResult._make, [], 0
    for (rid, lease, rsn, status, has_output, in_start, in_rows, out_start, out_rows, before,
         after, queue, execute, pack, unpack, code_len, message_len) in records:
        code = message = None
        if code_len:
            code_end = cut + code_len
            code, message, cut = text[cut:code_end], text[code_end:code_end + message_len], \
                code_end + message_len
        items.append(make((uuid_text(rid), uuid_text(lease), rsn, STATUSES[status], in_start,
                           in_rows, out_start if has_output else None, out_rows, before, after,
                           code, message, Timings(queue, execute, pack, unpack))))
    return Result(_uuid_text(batch_id), batch_seq, _hash_text(manifest_hash), tuple(items), tensor)


def _check_items(status: tuple[int, ...], has_output: tuple[int, ...], rows: tuple[tuple[int, ...], ...],
                 code_lens: tuple[int, ...], message_lens: tuple[int, ...]) -> None:
    """The table's own structure (COMPACT_METADATA), then each sequence result's rules over
    its columns (`columns.check_result_columns`, shared with the JSON form)."""
    in_rows, out_start, out_rows, before, after = rows
    if max(status) >= len(STATUSES) or max(has_output) > 1:
        raise _fail("unknown status or output flag")
    if max(code_lens) > MAX_ERROR_CODE_CHARS or max(message_lens) > MAX_ERROR_MESSAGE_CHARS \
            or any(map(_one_empty, code_lens, message_lens)):
        raise _fail("an error has a code of 1..64 and a message of 1..256 characters")
    if any(not flag and start for flag, start in zip(has_output, out_start, strict=True)):
        raise _fail("output_row_start must be zero without output rows")
    check_result_columns(tuple(map(_OK_CODE.__eq__, status)), in_rows, has_output, out_rows, code_lens,
                         before, after)


def _one_empty(code_len: int, message_len: int) -> bool:
    return (code_len == 0) != (message_len == 0)


# -- CREDIT --------------------------------------------------------------------------------
def encode_credit(credit: Credit, sequence_no: int) -> bytes:
    received = credit.batches_received
    return CREDIT_RECORD.pack(
        MAGIC, Kind.CREDIT, FLAG_BATCHES_RECEIVED if received is not None else 0, 0, sequence_no,
        credit.frames, credit.payload_bytes, credit.rows, credit.sequences, credit.live_requests,
        credit.kv_bytes, credit.replay_bytes, received or 0)


def decode_credit(metadata: bytes, sequence_no: int, batches_received: bool) -> Credit:
    """`batches_received`: the channel negotiated multi_inflight, so the field may be set;
    otherwise a CREDIT carrying it is METADATA, as the unknown JSON field is."""
    if len(metadata) != CREDIT_RECORD.size:
        raise _fail("a compact CREDIT is exactly 80 bytes")
    (magic, kind, flags, reserved, seq, frames, payload_bytes, rows, sequences, live_requests,
     kv_bytes, replay_bytes, received) = CREDIT_RECORD.unpack(metadata)
    if magic != MAGIC or kind != Kind.CREDIT:
        raise _fail("not a compact CREDIT")
    if flags & ~FLAG_BATCHES_RECEIVED or reserved or (not flags and received):
        raise _fail("reserved CREDIT fields must be zero")
    if seq != sequence_no:
        raise Fnx2Error(ErrorCode.SEQUENCE, "metadata sequence_no differs from the prelude")
    if flags and not batches_received:
        raise Fnx2Error(ErrorCode.METADATA, "batches_received was not negotiated on this channel")
    return Credit(frames, payload_bytes, rows, sequences, live_requests, kv_bytes, replay_bytes,
                  received if flags else None)
