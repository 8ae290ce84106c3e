"""In-band admission: CONTROL `admit` and its ACK (the negotiated `inband_admission` extension).

A request's lease opens on the data channel itself: the gateway sends CONTROL `admit` to
stage 0 before the request's first BATCH; each stage reserves KV, records the sampling, pins
the resident prompt prefix and forwards the same message to its next hop, in order. The ACK
comes back along the chain: admitted, with the prompt tokens each stage holds, or refused
with the per-sequence code `ADMISSION`, the refusing stage, a stable reason and a message. A
stage that admitted and then sees a refusal from further down undoes its own reservation.

Every field set is closed. Floats travel as the bits of an IEEE-754 binary32 (FNX2 metadata
holds integers, strings, booleans and null only), which is also the precision the sampling
parameters had on the control plane.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from libs.fnx2.wire.errors import MAX_ERROR_CODE_CHARS, ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import Fields, member
from libs.fnx2.wire.messages import MAX_ID_CHARS

EXT_INBAND_ADMISSION = "inband_admission"
# ACK cancel and ACK release name each stage's KV epoch, this stage first, on a channel that
# negotiated inband_admission.
STAGE_KV_EPOCHS_FIELD = "stage_kv_epochs"

MAX_TOKENS = 1 << 20  # prompt prefix and generated-token lists
MAX_BLOCKS = 1 << 16
MAX_LOGIT_BIAS = 1 << 16
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_TOP_LOGPROBS = 20
MAX_STAGES = 4096
MAX_REFUSAL_CHARS = 1024
UINT32_MAX = 0xFFFFFFFF
_HEX = re.compile(r"^(?:[0-9a-f]{2})*$")
_REASON = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


def f32_bits(value: float) -> int:
    """The binary32 bit pattern of `value` (rounded to single precision, as protobuf float)."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def f32_value(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


class OutputMode(StrEnum):
    SAMPLED_TOKENS = "sampled_tokens"
    LOGITS = "logits"


@dataclass(frozen=True, slots=True)
class Grammar:
    lark: str
    end_token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters; the `_f32` fields are binary32 bit patterns."""

    temperature_f32: int = 0
    top_k: int = 0
    top_p_f32: int = 0
    seed: int = 0
    presence_penalty_f32: int = 0
    frequency_penalty_f32: int = 0
    logit_bias: tuple[tuple[int, int], ...] = ()  # (token id, bias bits), ascending ids
    grammar: Grammar | None = None
    first_sample_position: int = 0
    generated_token_ids: tuple[int, ...] = ()
    top_logprobs: int | None = None

    def to_meta(self) -> dict[str, Any]:
        grammar = None if self.grammar is None else {
            "lark": self.grammar.lark, "end_token_ids": list(self.grammar.end_token_ids)}
        return {"temperature_f32": self.temperature_f32, "top_k": self.top_k,
                "top_p_f32": self.top_p_f32, "seed": self.seed,
                "presence_penalty_f32": self.presence_penalty_f32,
                "frequency_penalty_f32": self.frequency_penalty_f32,
                "logit_bias": [list(pair) for pair in self.logit_bias], "grammar": grammar,
                "first_sample_position": self.first_sample_position,
                "generated_token_ids": list(self.generated_token_ids),
                "top_logprobs": self.top_logprobs}

    @classmethod
    def from_meta(cls, meta: Any) -> Sampling:
        f = Fields(meta, ErrorCode.METADATA, "CONTROL.admission.sampling", _SAMPLING_FIELDS)
        top_logprobs = f.raw("top_logprobs")
        return cls(f.uint("temperature_f32", UINT32_MAX), f.uint("top_k", UINT32_MAX),
                   f.uint("top_p_f32", UINT32_MAX), f.uint("seed"),
                   f.uint("presence_penalty_f32", UINT32_MAX),
                   f.uint("frequency_penalty_f32", UINT32_MAX), _read_logit_bias(f),
                   _read_grammar(f), f.uint("first_sample_position", UINT32_MAX),
                   read_uints(f, "generated_token_ids", MAX_TOKENS),
                   None if top_logprobs is None else f.uint("top_logprobs", MAX_TOP_LOGPROBS))


_SAMPLING_FIELDS = frozenset({"temperature_f32", "top_k", "top_p_f32", "seed", "presence_penalty_f32",
                              "frequency_penalty_f32", "logit_bias", "grammar", "first_sample_position",
                              "generated_token_ids", "top_logprobs"})


@dataclass(frozen=True, slots=True)
class Admission:
    """One lease to open on every stage: its KV reservation, sampling and prompt prefix."""

    request_id: str
    execution_lease_id: str
    reserve_tokens: int
    output_mode: OutputMode
    sampling: Sampling
    prefix_salt: bytes = b""
    prefix_token_ids: tuple[int, ...] = ()
    prefix_block_hashes: tuple[bytes, ...] = ()

    def to_meta(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "execution_lease_id": self.execution_lease_id,
                "reserve_tokens": self.reserve_tokens, "output_mode": self.output_mode.value,
                "sampling": self.sampling.to_meta(), "prefix_salt": self.prefix_salt.hex(),
                "prefix_token_ids": list(self.prefix_token_ids),
                "prefix_block_hashes": [h.hex() for h in self.prefix_block_hashes]}

    @classmethod
    def from_meta(cls, meta: Any) -> Admission:
        f = Fields(meta, ErrorCode.METADATA, "CONTROL.admission", _ADMISSION_FIELDS)
        mode = member(OutputMode, f.raw("output_mode"))
        if mode is None:  # also a JSON list or object, which no enum lookup may hash
            raise f.fail("output_mode", "must be sampled_tokens or logits")
        hashes = f.array("prefix_block_hashes", MAX_BLOCKS)
        if any(type(h) is not str or len(h) != 64 or not _HEX.match(h) for h in hashes):
            raise f.fail("prefix_block_hashes", "must be 32-byte lower-case hex digests")
        return cls(f.uuid("request_id"), f.uuid("execution_lease_id"),
                   f.uint("reserve_tokens", UINT32_MAX, minimum=1), mode,
                   Sampling.from_meta(f.raw("sampling")), _hex(f, "prefix_salt"),
                   read_uints(f, "prefix_token_ids", MAX_TOKENS), tuple(bytes.fromhex(h) for h in hashes))


_ADMISSION_FIELDS = frozenset({"request_id", "execution_lease_id", "reserve_tokens", "output_mode",
                               "sampling", "prefix_salt", "prefix_token_ids", "prefix_block_hashes"})


@dataclass(frozen=True, slots=True)
class AckAdmit:
    """Admitted: the prompt tokens each stage holds, this stage first. Refused: `ADMISSION`,
    the refusing stage, its stable reason and its message; no stage keeps a reservation."""

    request_id: str
    execution_lease_id: str
    admitted: bool
    cached_tokens: tuple[int, ...] = ()
    error_code: str | None = None
    reason: str | None = None
    error_message: str | None = None
    refused_by: str | None = None

    def to_meta(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "execution_lease_id": self.execution_lease_id,
                "admitted": self.admitted, "cached_tokens": list(self.cached_tokens),
                "error_code": self.error_code, "reason": self.reason,
                "error_message": self.error_message, "refused_by": self.refused_by}

    @classmethod
    def read(cls, f: Fields) -> AckAdmit:
        admitted = f.boolean("admitted")
        cached = read_uints(f, "cached_tokens", MAX_STAGES)
        refusal = tuple(f.raw(name) for name in ("error_code", "reason", "error_message", "refused_by"))
        if admitted:
            if any(value is not None for value in refusal) or not cached:
                raise f.fail("admitted", "an admission names every stage's cached tokens and no error")
            return cls(f.uuid("request_id"), f.uuid("execution_lease_id"), True, cached)
        if cached:
            raise f.fail("cached_tokens", "must be empty for a refusal")
        code, reason = f.text("error_code", MAX_ERROR_CODE_CHARS), f.text("reason", 64)
        if code != ErrorCode.ADMISSION.value:
            raise f.fail("error_code", "must be ADMISSION")
        if not _REASON.match(reason):
            raise f.fail("reason", "must be an UPPER_SNAKE reason code")
        return cls(f.uuid("request_id"), f.uuid("execution_lease_id"), False, (), code, reason,
                   f.text("error_message", MAX_REFUSAL_CHARS), f.text("refused_by", MAX_ID_CHARS))

    @classmethod
    def refusal(cls, admission: Admission, reason: str, message: str, stage: str) -> AckAdmit:
        return cls(admission.request_id, admission.execution_lease_id, False, (),
                   ErrorCode.ADMISSION.value, reason, message[:MAX_REFUSAL_CHARS] or reason, stage)


ACK_ADMIT_FIELDS = frozenset({"request_id", "execution_lease_id", "admitted", "cached_tokens",
                              "error_code", "reason", "error_message", "refused_by"})


def read_stage_kv_epochs(f: Fields) -> tuple[int, ...]:
    return read_uints(f, STAGE_KV_EPOCHS_FIELD, MAX_STAGES)


def read_uints(f: Fields, name: str, limit: int) -> tuple[int, ...]:
    raw = f.array(name, limit)
    if any(type(x) is not int or not 0 <= x <= UINT32_MAX for x in raw):
        raise f.fail(name, "must hold integers in [0, 2^32-1]")
    return tuple(raw)


def _hex(f: Fields, name: str) -> bytes:
    value = f.raw(name)
    if type(value) is not str or len(value) > 512 or not _HEX.match(value):
        raise f.fail(name, "must be lower-case hex of at most 256 bytes")
    return bytes.fromhex(value)


def _read_logit_bias(f: Fields) -> tuple[tuple[int, int], ...]:
    raw = f.array("logit_bias", MAX_LOGIT_BIAS)
    pairs = []
    for pair in raw:
        if (type(pair) is not list or len(pair) != 2
                or any(type(x) is not int or not 0 <= x <= UINT32_MAX for x in pair)):
            raise f.fail("logit_bias", "must hold [token id, binary32 bits] pairs")
        pairs.append((pair[0], pair[1]))
    if any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:], strict=False)):
        raise f.fail("logit_bias", "token ids must ascend without repeats")
    return tuple(pairs)


def _read_grammar(f: Fields) -> Grammar | None:
    raw = f.raw("grammar")
    if raw is None:
        return None
    g = Fields(raw, ErrorCode.METADATA, "CONTROL.admission.sampling.grammar",
               frozenset({"lark", "end_token_ids"}))
    return Grammar(g.text("lark", MAX_GRAMMAR_CHARS), read_uints(g, "end_token_ids", MAX_TOKENS))


def require(negotiated: bool, what: str) -> None:
    """In-band admission fields on a channel that did not negotiate them are refused."""
    if not negotiated:
        raise Fnx2Error(ErrorCode.METADATA, f"{what} needs the {EXT_INBAND_ADMISSION} extension")
