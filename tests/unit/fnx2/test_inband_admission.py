"""CONTROL admit and ACK admit (the inband_admission extension): closed fields, canonical
JSON, refused without the extension, malformed admission metadata refused with METADATA."""

import uuid

import pytest

from libs.fnx2.wire.admission import (
    EXT_INBAND_ADMISSION,
    AckAdmit,
    Admission,
    Grammar,
    OutputMode,
    Sampling,
    f32_bits,
    f32_value,
)
from libs.fnx2.wire.codec import decode_frame, encode_frame
from libs.fnx2.wire.control import Ack, AckRelease, ChannelBinding, Control, Release
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import canonical_json

BINDING = ChannelBinding(str(uuid.uuid4()), "sha256:" + "a" * 64, "sha256:" + "b" * 64, "stage-0",
                         str(uuid.uuid4()))
INBAND = frozenset({EXT_INBAND_ADMISSION})


def _bytes(frame) -> bytes:
    return bytes(frame.header) + bytes(frame.payload)


def admission(**overrides) -> Admission:
    fields = {"request_id": str(uuid.uuid4()), "execution_lease_id": str(uuid.uuid4()), "reserve_tokens": 40,
                  "output_mode": OutputMode.SAMPLED_TOKENS,
                  "sampling": Sampling(temperature_f32=f32_bits(0.7), top_k=5, top_p_f32=f32_bits(0.9), seed=7,
                                    logit_bias=((3, f32_bits(-1.5)), (9, f32_bits(2.0))),
                                    grammar=Grammar("start: \"a\"", (2,)), generated_token_ids=(4, 5),
                                    top_logprobs=3),
                  "prefix_salt": b"\x01\x02", "prefix_token_ids": (1, 2, 3), "prefix_block_hashes": (b"\xab" * 32,)}
    fields.update(overrides)
    return Admission(**fields)


def test_admit_round_trips_in_canonical_json():
    control = Control("admit", str(uuid.uuid4()), BINDING, admission=admission())
    data = _bytes(encode_frame(control, 3))
    assert decode_frame(data, negotiated=INBAND).message == control
    assert b"0.7" not in data  # floats travel as binary32 bits


def test_binary32_bits_match_protobuf_float_precision():
    assert f32_value(f32_bits(0.7)) == pytest.approx(0.7, abs=1e-7) and f32_value(f32_bits(0.7)) != 0.7


def test_admit_without_the_extension_is_refused():
    data = _bytes(encode_frame(Control("admit", str(uuid.uuid4()), BINDING, admission=admission()), 1))
    with pytest.raises(Fnx2Error) as caught:
        decode_frame(data, negotiated=frozenset())
    assert caught.value.code is ErrorCode.METADATA


def test_ack_admit_round_trips_admitted_and_refused():
    a = admission()
    for fields in (AckAdmit(a.request_id, a.execution_lease_id, True, (16, 0)),
                   AckAdmit.refusal(a, "KV_CAPACITY", "no room", "stage-1")):
        ack = Ack("admit", str(uuid.uuid4()), fields)
        assert decode_frame(_bytes(encode_frame(ack, 2)), negotiated=INBAND).message == ack


def test_ack_release_names_every_stage_epoch_only_with_the_extension():
    rid, lease = str(uuid.uuid4()), str(uuid.uuid4())
    ack = Ack("release", str(uuid.uuid4()), AckRelease(rid, lease, True, 3, 0, True, (3, 3)))
    data = _bytes(encode_frame(ack, 2))
    assert decode_frame(data, negotiated=INBAND).message == ack
    with pytest.raises(Fnx2Error):
        decode_frame(data, negotiated=frozenset())


def _mutated(mutate) -> bytes:
    meta = Control("admit", str(uuid.uuid4()), BINDING, admission=admission()).to_meta()
    mutate(meta["admission"])
    meta["sequence_no"] = 1
    return meta


@pytest.mark.parametrize("mutate", [
    lambda m: m.pop("reserve_tokens"),
    lambda m: m.update(extra=1),
    lambda m: m.update(reserve_tokens=0),
    lambda m: m.update(reserve_tokens=-1),
    lambda m: m.update(output_mode="text"),
    lambda m: m.update(output_mode=["logits"]),
    lambda m: m.update(output_mode={"a": 1}),
    lambda m: m.update(request_id="not-a-uuid"),
    lambda m: m.update(prefix_salt="XYZ"),
    lambda m: m.update(prefix_salt="abc"),
    lambda m: m.update(prefix_token_ids=[1, -2]),
    lambda m: m.update(prefix_token_ids=[1, True]),
    lambda m: m.update(prefix_block_hashes=["ab"]),
    lambda m: m["sampling"].update(temperature_f32=2 ** 32),
    lambda m: m["sampling"].update(top_logprobs=21),
    lambda m: m["sampling"].update(logit_bias=[[9, 0], [3, 0]]),
    lambda m: m["sampling"].update(logit_bias=[[3, 0, 1]]),
    lambda m: m["sampling"].update(grammar={"lark": ""}),
    lambda m: m["sampling"].pop("seed"),
    lambda m: m.update(sampling=[]),
], ids=lambda _: "case")
def test_malformed_admission_metadata_is_refused_with_metadata(mutate):
    meta = _mutated(mutate)
    with pytest.raises(Fnx2Error) as caught:
        Control.from_meta({k: v for k, v in meta.items() if k != "sequence_no"}, True, INBAND)
    assert caught.value.code is ErrorCode.METADATA
    canonical_json(meta)  # every case is still valid JSON: the refusal is the field rule's


def _release(tokens: tuple[int, ...]) -> Release:
    return Release(str(uuid.uuid4()), BINDING, str(uuid.uuid4()), str(uuid.uuid4()), None, tokens)


def test_release_carries_the_tokens_to_publish_only_with_the_extension():
    release = _release((5, 6, 7))
    data = _bytes(encode_frame(release, 2))
    assert decode_frame(data, negotiated=INBAND).message == release
    with pytest.raises(Fnx2Error) as caught:
        decode_frame(data, negotiated=frozenset())
    assert caught.value.code is ErrorCode.METADATA


def test_a_plain_release_stays_a_plain_2_0_release():
    release = _release(())
    data = _bytes(encode_frame(release, 2))
    assert b"publish_token_ids" not in data
    assert decode_frame(data, negotiated=frozenset()).message == release


@pytest.mark.parametrize("value", [[], [-1], [2**32], ["7"], [1.0], "1,2"])
def test_malformed_tokens_to_publish_are_refused(value):
    meta = _release((1,)).to_meta() | {"publish_token_ids": value}
    with pytest.raises(Fnx2Error) as caught:
        Release.from_meta(meta, inband=True)
    assert caught.value.code is ErrorCode.METADATA


_ADMISSION_KEYS = sorted(admission().to_meta())
_SAMPLING_KEYS = sorted(admission().sampling.to_meta())


@pytest.mark.parametrize("junk", [[], ["x"], {}, {"a": [1]}, None, 1.5], ids=repr)
@pytest.mark.parametrize("path", [("admission", k) for k in _ADMISSION_KEYS]
                         + [("sampling", k) for k in _SAMPLING_KEYS], ids="/".join)
def test_any_admission_field_of_the_wrong_json_type_is_refused_never_raised(path, junk):
    """What the frame fuzz found: a JSON list where an enum name belongs raised TypeError
    (unhashable) inside the receiver instead of a METADATA refusal."""
    def mutate(m):
        (m if path[0] == "admission" else m["sampling"])[path[1]] = junk
    meta = _mutated(mutate)
    try:
        Control.from_meta({k: v for k, v in meta.items() if k != "sequence_no"}, True, INBAND)
    except Fnx2Error as exc:
        assert exc.code is ErrorCode.METADATA
