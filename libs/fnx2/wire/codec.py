"""FNX2 2.0 frame codec: a pure function of bytes in, typed messages out (and back).

Frame = 40-byte big-endian prelude `!4sHHHHIQQII` + canonical JSON metadata + payload.
Decoding follows the FNX2 validation order: length/version/CRC, canonical metadata,
plan binding, tensor, slice coverage (`columns.py`). Epoch, lease, replay and credit
rules are not the codec's: they are the stage's session rules, above the channel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from libs.fnx2.wire import compact
from libs.fnx2.wire.admission import EXT_INBAND_ADMISSION
from libs.fnx2.wire.columns import check_results, check_slices
from libs.fnx2.wire.control import (
    EXT_COMPACT_META,
    EXT_LEASE_SEQUENCE,
    EXT_MULTI_INFLIGHT,
    EXT_TRACEPARENT,
    KNOWN_EXTENSIONS,
    Ack,
    Cancel,
    ChannelBinding,
    Control,
    Credit,
    ErrorMessage,
    Release,
)
from libs.fnx2.wire.crc import crc32c_combine, crc32c_extend
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import (
    UINT64_MAX,
    canonical_json,
    is_hash,
    is_uuid,
    member,
    parse_json_noting_floats,
)
from libs.fnx2.wire.messages import (
    MAX_ID_CHARS,
    TRACEPARENT_CHARS,
    Batch,
    BatchDescriptor,
    Kind,
    Result,
    SequenceResult,
)
from libs.fnx2.wire.tensor import (
    DType,
    Tensor,
    TensorDescriptor,
    TensorKind,
    crc_and_finite,
    payload_is_finite,
    view_payload,
)

MAGIC = b"FNX2"
PRELUDE = struct.Struct("!4sHHHHIQQII")
PRELUDE_BYTES = PRELUDE.size
MAX_METADATA_BYTES = 256 * 1024
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
MAX_RESULTS_PER_FRAME = 4096
_DATA_KINDS = (Kind.BATCH, Kind.RESULT)
_COMPACT_KINDS = (Kind.BATCH, Kind.RESULT, Kind.CREDIT)  # what compact_meta may carry
# Handshake and control frames: few enough per channel that each one's typed re-encoding is
# compared with its bytes. BATCH, RESULT and CREDIT are read by strict typed readers instead.
_RARE_KINDS = frozenset({Kind.CANCEL, Kind.RELEASE, Kind.ACK, Kind.ERROR, Kind.CONTROL})

Message = Batch | Result | Credit | Cancel | Release | Ack | ErrorMessage | Control


@dataclass(frozen=True, slots=True)
class CodecLimits:
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_metadata_bytes: int = MAX_METADATA_BYTES


DEFAULT_LIMITS = CodecLimits()


# Per-frame records are named tuples: built in one C call, where a frozen dataclass sets
# each field through object.__setattr__.
class Prelude(NamedTuple):
    kind: int
    metadata_bytes: int
    payload_bytes: int
    sequence_no: int
    crc32c: int

    @property
    def body_bytes(self) -> int:
        return self.metadata_bytes + self.payload_bytes


class Frame(NamedTuple):
    sequence_no: int
    message: Message


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """Prelude+metadata bytes and a zero-copy payload view, for scatter/gather writes."""

    header: bytes
    payload: memoryview

    def __len__(self) -> int:
        return len(self.header) + len(self.payload)

    def to_bytes(self) -> bytes:
        return self.header + bytes(self.payload)


@dataclass(frozen=True, slots=True)
class ExpectedBinding:
    """What a receiver requires of each BATCH (step 3) and of its tensor (step 4)."""

    binding: ChannelBinding
    source_stage: str | None = None
    input_kind: TensorKind | None = None
    input_dtype: DType | None = None
    input_width: int | None = None


def payload_crc(message: Message) -> int:
    """CRC32C of a message's payload alone: computable before its sequence number is
    known, then combined with the metadata's CRC by `encode_frame`."""
    tensor = getattr(message, "tensor", None)
    return 0 if tensor is None else crc_of(tensor.payload())


def encode_frame(message: Message, sequence_no: int, limits: CodecLimits = DEFAULT_LIMITS, *,
                 check_finite: bool = False, known_payload_crc: int | None = None,
                 compact_meta: bool = False) -> EncodedFrame:
    """Encode one message. Finiteness is enforced where tensors are built
    (`Tensor.from_array`) and by every decoder; `check_finite` repeats it here.
    `known_payload_crc` (from `payload_crc`) spares the pass over the payload.
    `compact_meta` (negotiated) writes BATCH and RESULT metadata in the binary form of
    `libs.fnx2.wire.compact` whenever that form can carry the message, JSON otherwise."""
    if type(sequence_no) is not int or not 0 <= sequence_no <= UINT64_MAX:
        raise Fnx2Error(ErrorCode.SEQUENCE, "sequence_no must be a uint64")
    metadata = _encode_metadata(message, sequence_no, compact_meta)
    if len(metadata) > limits.max_metadata_bytes:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "metadata exceeds its maximum")
    tensor = getattr(message, "tensor", None)
    payload = tensor.payload() if tensor is not None else memoryview(b"")
    if len(payload) > limits.max_payload_bytes:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "payload exceeds the configured maximum")
    _check_outgoing(message)
    dtype = tensor.descriptor.dtype if tensor is not None and check_finite else None
    if known_payload_crc is not None and dtype is None:
        crc, finite = crc32c_combine(crc_of(metadata), known_payload_crc, len(payload)), True
    else:
        crc, finite = crc_and_finite(crc_of(metadata), payload, dtype)
    if not finite:
        raise Fnx2Error(ErrorCode.TENSOR_CONTRACT, "tensor values must be finite")
    prelude = PRELUDE.pack(MAGIC, 2, 0, message.KIND, 0, len(metadata), len(payload),
                           sequence_no, crc, 0)
    return EncodedFrame(prelude + metadata, payload)


def _encode_metadata(message: Message, sequence_no: int, compact_meta: bool) -> bytes:
    """The compact binary metadata where negotiated and able to carry the message, else
    canonical JSON."""
    binary = None
    if compact_meta and isinstance(message, Batch):
        binary = compact.encode_batch(message, sequence_no)
    elif compact_meta and isinstance(message, Result):
        binary = compact.encode_result(message, sequence_no)
    elif compact_meta and isinstance(message, Credit):
        binary = compact.encode_credit(message, sequence_no)
    if binary is not None:
        return binary
    if isinstance(message, Batch):
        return message.encode_metadata(sequence_no)
    meta = message.to_meta()
    meta["sequence_no"] = sequence_no
    return canonical_json(meta, may_hold_floats=False)  # typed fields: no floats


def crc_of(data: bytes | memoryview) -> int:
    return crc32c_extend(0, data)


def _check_outgoing(message: Message) -> None:
    """An encoder never emits what its own decoder would reject."""
    if isinstance(message, Batch):
        check_slices(message.batch.phase, message.batch.input_row_count, message.batch.sequences)
        if message.tensor.descriptor.rows != message.batch.input_row_count:
            raise Fnx2Error(ErrorCode.BATCH_CONTRACT, "tensor rows differ from input_row_count")
    elif isinstance(message, Result):
        check_results(message.results)
        message.check()


def parse_prelude(data: bytes | memoryview, limits: CodecLimits = DEFAULT_LIMITS) -> Prelude:
    """Step 1a: magic, version, flags, reserved, kind, then the bounded lengths."""
    if len(data) < PRELUDE_BYTES:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "short frame prelude")
    magic, major, minor, kind, flags, meta_len, payload_len, seq, crc, reserved = PRELUDE.unpack(
        data[:PRELUDE_BYTES])
    if magic != MAGIC:
        raise Fnx2Error(ErrorCode.ABI_VERSION, "bad magic")
    if (major, minor) != (2, 0):
        raise Fnx2Error(ErrorCode.ABI_VERSION, f"unsupported ABI version {major}.{minor}")
    if flags or reserved:
        raise Fnx2Error(ErrorCode.ABI_VERSION, "flags and reserved must be zero")
    if not Kind.BATCH <= kind <= Kind.CONTROL:
        raise Fnx2Error(ErrorCode.ABI_VERSION, f"unknown message kind {kind}")
    if meta_len > limits.max_metadata_bytes or payload_len > limits.max_payload_bytes:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "frame length exceeds the configured maximum")
    if payload_len and kind not in _DATA_KINDS:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "only BATCH and RESULT carry a payload")
    return Prelude(kind, meta_len, payload_len, seq, crc)


def decode_frame(data: bytes | bytearray | memoryview, limits: CodecLimits = DEFAULT_LIMITS, *,
                 expected: ExpectedBinding | None = None, allow_extensions: bool = True,
                 negotiated: frozenset[str] | None = None) -> Frame:
    view = memoryview(data)
    prelude = parse_prelude(view, limits)
    if len(view) != PRELUDE_BYTES + prelude.body_bytes:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "frame length differs from its prelude")
    return decode_body(prelude, view[PRELUDE_BYTES:], expected=expected,
                       allow_extensions=allow_extensions, negotiated=negotiated)


def decode_body(prelude: Prelude, body: memoryview | bytes, *, expected: ExpectedBinding | None = None,
                allow_extensions: bool = True, negotiated: frozenset[str] | None = None,
                body_crc: int | None = None,
                slice_crcs: tuple[tuple[int, int, int], ...] | None = None,
                finite: tuple[DType, bool] | None = None) -> Frame:
    """Steps 1b..5 for one length-delimited body (metadata ‖ payload).

    `allow_extensions` admits the extension offer and its ACK; `negotiated` names the
    extensions whose fields (BATCH `traceparent`, CREDIT `batches_received`) a channel
    accepts, and is empty until the offer was accepted. None (a bare decode, no channel)
    accepts every known extension's fields when `allow_extensions` is set.

    `body_crc`, `finite` and `slice_crcs`, when the transport computed them as the bytes
    arrived, save passes over the payload; `finite` counts only for the dtype the
    validated metadata names."""
    if len(body) != prelude.body_bytes:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, "body length differs from its prelude")
    view = memoryview(body)
    metadata = bytes(view[: prelude.metadata_bytes])
    payload = view[prelude.metadata_bytes:]
    if negotiated is None:
        negotiated = KNOWN_EXTENSIONS if allow_extensions else frozenset()
    if prelude.kind in _COMPACT_KINDS and compact.is_compact(metadata):
        message = _decode_compact(prelude, metadata, payload, expected, negotiated, body_crc, finite)
        if slice_crcs and isinstance(message, Batch):
            message = _with_input_crcs(message, slice_crcs)
        return Frame(prelude.sequence_no, message)
    parsed, floats, meta_error = _parse_json(metadata)
    dtype = _peek_dtype(parsed)
    all_finite = _check_crc(prelude, metadata, payload, dtype, body_crc, finite)
    if meta_error is not None:
        raise meta_error
    meta = _canonical(parsed, floats, metadata, prelude.sequence_no)
    message = _decode_kind(prelude.kind, meta, metadata, payload, all_finite, expected,
                           allow_extensions, negotiated)
    if prelude.kind in _RARE_KINDS:
        _check_reencodes_to(message, metadata, prelude.sequence_no)
    if slice_crcs and isinstance(message, Batch):
        message = _with_input_crcs(message, slice_crcs)
    return Frame(prelude.sequence_no, message)


def _decode_compact(prelude: Prelude, metadata: bytes, payload: memoryview,
                    expected: ExpectedBinding | None, negotiated: frozenset[str],
                    body_crc: int | None, finite: tuple[DType, bool] | None) -> Message:
    """Steps 1b..5 for compact BATCH/RESULT/CREDIT metadata (the `compact_meta` extension)."""
    dtype = compact.payload_dtype(metadata, prelude.kind) if prelude.kind in _DATA_KINDS else None
    dtype = None if dtype is DType.INT32 else dtype
    all_finite = _check_crc(prelude, metadata, payload, dtype, body_crc, finite)
    if EXT_COMPACT_META not in negotiated:
        raise Fnx2Error(ErrorCode.METADATA, "compact metadata was not negotiated on this channel")
    if prelude.kind == Kind.CREDIT:
        return compact.decode_credit(metadata, prelude.sequence_no, EXT_MULTI_INFLIGHT in negotiated)
    if prelude.kind == Kind.RESULT:
        return _decode_compact_result(prelude, metadata, payload, all_finite)
    return _decode_compact_batch(prelude, metadata, payload, all_finite, expected, negotiated)


def _check_crc(prelude: Prelude, metadata: bytes, payload: memoryview, dtype: DType | None,
               body_crc: int | None, finite: tuple[DType, bool] | None) -> bool:
    """Step 1b: the frame's CRC32C (computed here unless the transport did as the bytes
    arrived); returns whether the payload is finite for `dtype`, from one shared pass."""
    if body_crc is None:
        crc, all_finite = crc_and_finite(crc_of(metadata), payload, dtype)
    elif finite is not None and finite[0] is dtype:
        crc, all_finite = body_crc, finite[1]
    else:
        crc, all_finite = body_crc, dtype is None or payload_is_finite(payload, dtype)
    if crc != prelude.crc32c:
        raise Fnx2Error(ErrorCode.CHECKSUM, "CRC32C mismatch")
    return all_finite


def _decode_compact_result(prelude: Prelude, metadata: bytes, payload: memoryview,
                           all_finite: bool) -> Result:
    def result_tensor(descriptor: TensorDescriptor | None) -> Tensor | None:
        if (descriptor is not None) != bool(len(payload)):
            raise Fnx2Error(ErrorCode.BATCH_RESULT, "RESULT tensor and payload appear together")
        return None if descriptor is None else _tensor_from(descriptor, payload, all_finite)

    result = compact.decode_result(metadata, prelude.sequence_no, result_tensor)
    result.check()
    return result


def _decode_compact_batch(prelude: Prelude, metadata: bytes, payload: memoryview, all_finite: bool,
                          expected: ExpectedBinding | None, negotiated: frozenset[str]) -> Batch:
    def attach(plan_id: str, plan_hash: str, manifest_hash: str, source: str, destination: str,
               descriptor: TensorDescriptor) -> Tensor:
        if expected is not None:
            _check_binding(expected, plan_id, plan_hash, manifest_hash, source, destination)
        tensor = _tensor_from(descriptor, payload, all_finite)
        if expected is not None:
            _check_input_tensor(expected, descriptor)
        return tensor

    batch = compact.decode_batch(metadata, prelude.sequence_no, attach,
                                 EXT_LEASE_SEQUENCE in negotiated)
    if batch.traceparent is not None and EXT_TRACEPARENT not in negotiated:
        raise Fnx2Error(ErrorCode.METADATA, "traceparent was not negotiated on this channel")
    return batch


def _check_reencodes_to(message: Message, metadata: bytes, sequence_no: int) -> None:
    """FNX2: a decoder re-encodes what it parsed and rejects any difference. The canonical
    check above compares the parsed JSON; this compares the typed message, which catches
    a value that reads as valid but is spelled otherwise (`2.0` read as the version 2)."""
    meta = message.to_meta()
    meta["sequence_no"] = sequence_no
    if canonical_json(meta, may_hold_floats=False) != metadata:
        raise Fnx2Error(ErrorCode.METADATA, f"{type(message).__name__} re-encodes to other bytes")


def _with_input_crcs(batch: Batch, slice_crcs: tuple[tuple[int, int, int], ...]) -> Batch:
    """Attach per-sequence input CRCs computed on arrival, if their byte ranges are exactly
    those of the validated batch; otherwise the receiver computes them itself."""
    row_bytes = batch.tensor.descriptor.row_bytes
    ranges = [(s.input_row_start * row_bytes, (s.input_row_start + s.input_row_count) * row_bytes)
              for s in batch.batch.sequences]
    if ranges != [(start, end) for start, end, _ in slice_crcs]:
        return batch
    return dataclasses.replace(batch, input_crcs=tuple(crc for _, _, crc in slice_crcs))


def _parse_json(metadata: bytes) -> tuple[Any, bool, Fnx2Error | None]:
    try:
        return *parse_json_noting_floats(metadata), None
    except (ValueError, RecursionError) as exc:
        return None, False, Fnx2Error(ErrorCode.METADATA, f"metadata is not valid JSON: {exc}")


def _peek_dtype(parsed: Any) -> DType | None:
    """The tensor dtype, if the metadata names one, so CRC and finiteness share one pass."""
    tensor = parsed.get("tensor") if type(parsed) is dict else None
    dtype = tensor.get("dtype") if type(tensor) is dict else None
    return member(DType, dtype)


def _canonical(parsed: Any, floats: bool, metadata: bytes, sequence_no: int) -> dict[str, Any]:
    if type(parsed) is not dict:
        raise Fnx2Error(ErrorCode.METADATA, "metadata must be a JSON object")
    try:
        again = canonical_json(parsed, may_hold_floats=floats)
    except (ValueError, RecursionError) as exc:
        raise Fnx2Error(ErrorCode.METADATA, f"metadata cannot be re-encoded: {exc}") from exc
    if again != metadata:
        raise Fnx2Error(ErrorCode.METADATA, "metadata is not canonical JSON")
    if parsed.get("sequence_no") != sequence_no or type(parsed.get("sequence_no")) is not int:
        raise Fnx2Error(ErrorCode.SEQUENCE, "metadata sequence_no differs from the prelude")
    meta = dict(parsed)
    del meta["sequence_no"]
    return meta


def _decode_kind(kind: int, meta: dict[str, Any], metadata: bytes, payload: memoryview,
                 finite: bool, expected: ExpectedBinding | None, allow_extensions: bool,
                 negotiated: frozenset[str]) -> Message:
    if kind == Kind.BATCH:
        return _decode_batch(meta, metadata, payload, finite, expected,
                             EXT_TRACEPARENT in negotiated, EXT_LEASE_SEQUENCE in negotiated)
    if kind == Kind.RESULT:
        return _decode_result(meta, payload, finite)
    if kind == Kind.CREDIT:
        return Credit.from_meta(meta, EXT_MULTI_INFLIGHT in negotiated)
    if kind == Kind.CANCEL:
        return Cancel.from_meta(meta)
    if kind == Kind.RELEASE:
        return Release.from_meta(meta, EXT_INBAND_ADMISSION in negotiated)
    if kind == Kind.ACK:
        return Ack.from_meta(meta, allow_extensions, negotiated)
    if kind == Kind.ERROR:
        return ErrorMessage.from_meta(meta)
    return Control.from_meta(meta, allow_extensions, negotiated)


_BATCH_FIELDS = frozenset({"plan_id", "plan_hash", "manifest_hash", "source_stage",
                           "destination_stage", "batch", "batch_digest", "tensor"})


def _decode_batch(meta: dict[str, Any], metadata: bytes, payload: memoryview, finite: bool,
                  expected: ExpectedBinding | None, traceparent_negotiated: bool,
                  lease_sequence_negotiated: bool = False) -> Batch:
    names = _BATCH_FIELDS | ({"traceparent"} if traceparent_negotiated and "traceparent" in meta
                             else set())
    if meta.keys() != names:
        raise Fnx2Error(ErrorCode.METADATA, "BATCH metadata must have exactly its closed field set")
    traceparent = meta.get("traceparent")
    if traceparent is not None and (type(traceparent) is not str or len(traceparent) != TRACEPARENT_CHARS):
        raise Fnx2Error(ErrorCode.METADATA, "traceparent must be a W3C traceparent string")
    plan_id, plan_hash, manifest_hash = meta["plan_id"], meta["plan_hash"], meta["manifest_hash"]
    source, destination = meta["source_stage"], meta["destination_stage"]
    if not (is_uuid(plan_id) and is_hash(plan_hash) and is_hash(manifest_hash)
            and _is_id(source) and _is_id(destination) and is_hash(meta["batch_digest"])):
        raise Fnx2Error(ErrorCode.METADATA, "BATCH binding fields are malformed")
    if expected is not None:
        _check_binding(expected, plan_id, plan_hash, manifest_hash, source, destination)
    tensor = _decode_tensor(meta["tensor"], payload, finite)
    if expected is not None:
        _check_input_tensor(expected, tensor.descriptor)
    descriptor = BatchDescriptor.from_meta(meta["batch"], lease_sequence_negotiated)
    check_slices(descriptor.phase, descriptor.input_row_count, descriptor.sequences)
    if _batch_digest(metadata) != meta["batch_digest"]:
        raise Fnx2Error(ErrorCode.BATCH_CONTRACT, "batch_digest differs from the batch")
    if tensor.descriptor.rows != descriptor.input_row_count:
        raise Fnx2Error(ErrorCode.BATCH_CONTRACT, "tensor rows differ from input_row_count")
    return Batch(plan_id, plan_hash, manifest_hash, source, destination, descriptor, tensor,
                 traceparent)


def _batch_digest(metadata: bytes) -> str:
    """sha256 of the batch JSON as it sits in the (already canonical) metadata.

    "batch" is the first key, and the batch object has a closed key set whose strings
    escape quotes, so its value ends exactly at the first `,"batch_digest":`.
    """
    start = len(b'{"batch":')
    end = metadata.find(b',"batch_digest":', start)
    return "sha256:" + hashlib.sha256(metadata[start:end]).hexdigest()


def _is_id(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_ID_CHARS


def _check_binding(expected: ExpectedBinding, plan_id: str, plan_hash: str, manifest_hash: str,
                   source: str, destination: str) -> None:
    b = expected.binding
    if (plan_id, plan_hash, manifest_hash) != (b.plan_id, b.plan_hash, b.manifest_hash):
        raise Fnx2Error(ErrorCode.STALE_PLAN, "batch plan or manifest differs from the channel")
    if destination != b.stage_id or (expected.source_stage not in (None, source)):
        raise Fnx2Error(ErrorCode.STALE_PLAN, "batch source or destination stage differs")


def _check_input_tensor(expected: ExpectedBinding, descriptor: TensorDescriptor) -> None:
    if expected.input_kind is not None and descriptor.kind is not expected.input_kind:
        raise Fnx2Error(ErrorCode.TENSOR_CONTRACT, "tensor kind differs from the stage input")
    if expected.input_dtype is not None and descriptor.kind is not TensorKind.TOKEN_IDS:
        if descriptor.dtype is not expected.input_dtype:
            raise Fnx2Error(ErrorCode.TENSOR_CONTRACT, "tensor dtype differs from the stage input")
    if expected.input_width is not None and descriptor.kind is not TensorKind.TOKEN_IDS:
        if descriptor.width != expected.input_width:
            raise Fnx2Error(ErrorCode.TENSOR_CONTRACT, "tensor width differs from the stage input")


def _decode_tensor(meta: Any, payload: memoryview, finite: bool) -> Tensor:
    return _tensor_from(TensorDescriptor.from_meta(meta), payload, finite)


def _tensor_from(descriptor: TensorDescriptor, payload: memoryview, finite: bool) -> Tensor:
    if descriptor.payload_bytes != len(payload):
        raise Fnx2Error(ErrorCode.TENSOR_CONTRACT, "payload length differs from the descriptor")
    if not finite:
        raise Fnx2Error(ErrorCode.TENSOR_CONTRACT, "tensor values must be finite")
    return Tensor(descriptor, view_payload(descriptor, payload))


_RESULT_FIELDS = frozenset({"batch_id", "batch_sequence_no", "manifest_hash", "results"})


def _decode_result(meta: dict[str, Any], payload: memoryview, finite: bool) -> Result:
    with_tensor = "tensor" in meta
    if meta.keys() != (_RESULT_FIELDS | {"tensor"} if with_tensor else _RESULT_FIELDS):
        raise Fnx2Error(ErrorCode.METADATA, "RESULT metadata must have exactly its closed field set")
    if with_tensor != bool(len(payload)):
        raise Fnx2Error(ErrorCode.BATCH_RESULT, "RESULT tensor and payload appear together")
    tensor = _decode_tensor(meta["tensor"], payload, finite) if with_tensor else None
    raw = meta["results"]
    if type(raw) is not list or len(raw) > MAX_RESULTS_PER_FRAME:
        raise Fnx2Error(ErrorCode.BATCH_RESULT, "results must be a bounded array")
    batch_id, seq, manifest_hash = meta["batch_id"], meta["batch_sequence_no"], meta["manifest_hash"]
    if not (is_uuid(batch_id) and is_hash(manifest_hash) and type(seq) is int
            and 0 <= seq <= UINT64_MAX):
        raise Fnx2Error(ErrorCode.BATCH_RESULT, "RESULT correlation fields are malformed")
    result = Result(batch_id, seq, manifest_hash,
                    tuple(SequenceResult.from_meta(item) for item in raw), tensor)
    check_results(result.results)
    result.check()
    return result
