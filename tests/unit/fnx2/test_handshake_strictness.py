"""The two lenient handshake decodes a differential fuzz found: FNX2 2.0 sends exactly
`supported_versions` [[2,0]] and `selected_version` [2,0], and a decoder refuses anything whose
typed re-encoding differs from the bytes it received (METADATA, the recoverable code)."""

import pytest

from libs.fnx2.wire.codec import decode_frame, encode_frame
from libs.fnx2.wire.control import KNOWN_EXTENSIONS, Ack, AckHello, Control
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from tests.unit.fnx2.factories import BINDING, reframe, split

CONTROL_ID = "dddddddd-dddd-4ddd-8ddd-dddddddddddd"
HELLO = encode_frame(Control("hello", CONTROL_ID, BINDING, ((2, 0),)), 0).to_bytes()
ACK_HELLO = encode_frame(Ack("hello", CONTROL_ID, AckHello(BINDING)), 1).to_bytes()


def with_field(frame: bytes, name: str, value: object) -> bytes:
    _, meta, _ = split(frame)
    meta[name] = value
    return reframe(frame, meta=meta)


def refusal(frame: bytes) -> ErrorCode:
    with pytest.raises(Fnx2Error) as info:
        decode_frame(frame, negotiated=KNOWN_EXTENSIONS)
    return info.value.code


@pytest.mark.parametrize("versions", [[[2, 0], [2, 1]], [[2, 0], [2, 0]], [[2, 1], [2, 0]]])
def test_hello_must_advertise_exactly_version_2_0(versions):
    assert decode_frame(HELLO).message.supported_versions == ((2, 0),)
    assert refusal(with_field(HELLO, "supported_versions", versions)) is ErrorCode.METADATA


def test_ack_hello_with_a_float_version_is_refused_not_re_encoded_differently():
    assert decode_frame(ACK_HELLO, negotiated=KNOWN_EXTENSIONS).message.fields.selected_version == (2, 0)
    floated = with_field(ACK_HELLO, "selected_version", [2.0, 0])
    assert b'"selected_version":[2.0,0]' in floated
    assert refusal(floated) is ErrorCode.METADATA
