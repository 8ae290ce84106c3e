"""Which reference `fornax qualify` compares a fleet with: the whole model in transformers, or
the layer-streamed one (`libs.model.streamed_reference`), and why.

The whole reference holds the float32 model in this process (transformers' `from_pretrained`,
then `generate`), so it is chosen by `auto` only when the model's float32 bytes plus a margin fit
in the memory available when the fleet is already up; otherwise the streamed reference, which
holds about one decoded layer. Pure: the bytes are handed in.
"""

from __future__ import annotations

from dataclasses import dataclass

WHOLE = "whole"
STREAMED = "streamed"
AUTO = "auto"
REFERENCES = (WHOLE, STREAMED, AUTO)
# Beside the float32 weights the whole reference holds torch's and transformers' own baseline,
# a loaded shard's source tensors while they convert, and the activations: a fixed GiB plus a
# quarter of the model.
FIXED_MARGIN_BYTES = 2**30
MARGIN_FRACTION = 0.25


@dataclass(frozen=True)
class ReferenceChoice:
    kind: str  # WHOLE or STREAMED
    requested: str  # one of REFERENCES
    model_f32_bytes: int
    available_bytes: int  # MemAvailable when the choice was made (0: not read)

    @property
    def needed_bytes(self) -> int:
        return whole_reference_bytes(self.model_f32_bytes)

    def describe(self) -> str:
        sizes = (f"the whole float32 model needs {_gib(self.model_f32_bytes)} + margin "
                 f"= {_gib(self.needed_bytes)}")
        if self.requested != AUTO:
            return f"{self.kind} reference (--reference {self.requested}); {sizes}"
        relation = "exceeds" if self.kind == STREAMED else "fits in"
        return (f"{self.kind} reference (--reference auto): {sizes}, which {relation} the "
                f"{_gib(self.available_bytes)} available")


def whole_reference_bytes(model_f32_bytes: int) -> int:
    return model_f32_bytes + FIXED_MARGIN_BYTES + int(model_f32_bytes * MARGIN_FRACTION)


def choose_reference(requested: str, model_f32_bytes: int, available_bytes: int) -> ReferenceChoice:
    """`auto`: streamed when the whole reference's bytes exceed `available_bytes`."""
    if requested not in REFERENCES:
        raise ValueError(f"reference must be one of {', '.join(REFERENCES)}, got {requested!r}")
    kind = requested
    if requested == AUTO:
        kind = STREAMED if whole_reference_bytes(model_f32_bytes) > available_bytes else WHOLE
    return ReferenceChoice(kind, requested, model_f32_bytes, available_bytes)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)"
