"""Hypothesis: every message kind and every dtype round-trips exactly through the codec."""

import uuid

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.fnx2.wire.codec import decode_frame, encode_frame
from libs.fnx2.wire.control import (
    Ack,
    AckCancel,
    AckHello,
    AckRelease,
    AckStage,
    Cancel,
    Control,
    Credit,
    ErrorMessage,
    Release,
)
from libs.fnx2.wire.messages import (
    Batch,
    BatchDescriptor,
    Phase,
    Result,
    SequenceResult,
    SequenceSlice,
    SequenceStatus,
    Timings,
)
from libs.fnx2.wire.tensor import Tensor, bf16_to_float32, float32_to_bf16
from tests.unit.fnx2.factories import BINDING, MANIFEST_HASH, PLAN_HASH, PLAN_ID

UINT64 = st.integers(0, 2**64 - 1)
uuids = st.builds(lambda n: str(uuid.UUID(int=n, version=4)), st.integers(0, 2**128 - 1))
names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=16)
FLOAT_KINDS = st.sampled_from([("activation", "bf16"), ("activation", "fp16"),
                               ("activation", "fp32"), ("logits", "bf16"), ("logits", "fp16"),
                               ("logits", "fp32")])


@st.composite
def tensors(draw, rows: int):
    kind, dtype = draw(st.one_of(st.just(("token_ids", "int32")), FLOAT_KINDS))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "token_ids":
        return Tensor.from_array(kind, dtype, rng.integers(-2**31, 2**31 - 1, rows, dtype=np.int32))
    width = draw(st.integers(1, 9))
    values = (rng.standard_normal((rows, width)) * 100).astype(np.float32)
    return Tensor.from_array(kind, dtype, values.astype(np.float16) if dtype == "fp16" else values)


@st.composite
def batches(draw):
    phase = draw(st.sampled_from(list(Phase)))
    counts = draw(st.lists(st.integers(1, 1 if phase is Phase.DECODE else 6), min_size=1, max_size=6))
    requests = draw(st.lists(uuids, min_size=len(counts), max_size=len(counts), unique=True))
    slices, cursor = [], 0
    for request_id, count in zip(requests, counts, strict=True):
        slices.append(SequenceSlice(request_id, draw(UINT64), cursor, count, draw(UINT64),
                                    draw(UINT64), draw(UINT64), draw(uuids), draw(names), draw(names)))
        cursor += count
    descriptor = BatchDescriptor(draw(uuids), draw(UINT64), phase, cursor, tuple(slices))
    traceparent = draw(st.one_of(st.none(), st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01")))
    return Batch(PLAN_ID, PLAN_HASH, MANIFEST_HASH, draw(names), draw(names), descriptor,
                 draw(tensors(cursor)), traceparent)


@st.composite
def results(draw):
    count = draw(st.integers(1, 5))
    identities = sorted(zip(draw(st.lists(uuids, min_size=count, max_size=count, unique=True)),
                            draw(st.lists(uuids, min_size=count, max_size=count)), strict=True))
    items, cursor = [], 0
    for request_id, lease_id in identities:
        status = draw(st.sampled_from(list(SequenceStatus)))
        rows, epoch = draw(st.integers(1, 4)), draw(st.integers(0, 2**32))
        timings = Timings(*(draw(UINT64) for _ in range(4)))
        if status is SequenceStatus.OK:
            items.append(SequenceResult(request_id, lease_id, 0, status, 0, rows, cursor, rows,
                                        epoch, epoch + 1, None, None, timings))
            cursor += rows
        else:
            items.append(SequenceResult(request_id, lease_id, 3, status, 0, rows, None, 0, epoch,
                                        epoch, "DEADLINE", draw(names), timings))
    tensor = draw(tensors(cursor)) if cursor else None
    return Result(draw(uuids), draw(UINT64), MANIFEST_HASH, tuple(items), tensor)


def control_messages():
    acks = st.one_of(
        st.builds(AckHello, st.just(BINDING)),
        st.builds(AckCancel, uuids, uuids, st.booleans(), st.booleans(), st.booleans()),
        st.builds(AckRelease, uuids, uuids, st.booleans(), st.one_of(st.none(), UINT64), UINT64,
                  st.booleans()),
        st.builds(AckStage, names),
    )
    return st.one_of(
        st.builds(Credit, *(UINT64 for _ in range(7))),
        st.builds(Cancel, uuids, st.just(BINDING), uuids, uuids),
        st.builds(Release, uuids, st.just(BINDING), uuids, uuids, st.one_of(st.none(), UINT64)),
        st.builds(ErrorMessage, st.sampled_from(["METADATA", "CREDIT"]), names,
                  st.one_of(st.none(), uuids)),
        st.builds(lambda op, cid: Control(op, cid, BINDING, ((2, 0),) if op == "hello" else ()),
                  st.sampled_from(["hello", "shutdown", "credit_refresh"]), uuids),
        st.builds(lambda cid, ext: Control("extensions", cid, BINDING, extensions=tuple(ext)),
                  uuids, st.lists(names, max_size=4, unique=True)),
        st.builds(lambda f, cid: Ack(_operation(f), cid, f), acks, uuids),
    )


def _operation(fields) -> str:
    return {AckHello: "hello", AckCancel: "cancel", AckRelease: "release"}.get(type(fields), "shutdown")


def same_tensor(a: Tensor | None, b: Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.descriptor == b.descriptor and a.array.tobytes() == b.array.tobytes()


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(batches(), UINT64)
def test_batches_round_trip(batch, sequence_no):
    frame = decode_frame(encode_frame(batch, sequence_no).to_bytes())
    assert frame.sequence_no == sequence_no
    assert frame.message.to_meta() == batch.to_meta()
    assert same_tensor(frame.message.tensor, batch.tensor)


@SETTINGS
@given(results(), UINT64)
def test_results_round_trip(result, sequence_no):
    decoded = decode_frame(encode_frame(result, sequence_no).to_bytes()).message
    assert decoded.to_meta() == result.to_meta() and same_tensor(decoded.tensor, result.tensor)


@SETTINGS
@given(control_messages(), UINT64)
def test_control_messages_round_trip(message, sequence_no):
    encoded = encode_frame(message, sequence_no).to_bytes()
    assert decode_frame(encoded).message == message


@given(st.lists(st.floats(-2.0**127, 2.0**127, width=32, allow_subnormal=False), min_size=1, max_size=64))
def test_bf16_rounding_is_nearest_and_round_trips(values):
    source = np.asarray(values, dtype=np.float32)
    bits = float32_to_bf16(source)
    back = bf16_to_float32(bits)
    assert np.array_equal(float32_to_bf16(back), bits)
    assert np.all(np.abs(back - source) <= np.abs(source) * 2.0**-8 + 1e-38)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
              max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_canonical_json_is_exactly_the_standard_library_form(value):
    import json

    from libs.fnx2.wire.fields import canonical_json, parse_json

    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert canonical_json(value) == expected.encode("ascii")
    assert parse_json(expected.encode("ascii")) == json.loads(expected)
