"""The weight-format table a stage's safetensors file carries in its `__metadata__`.

Key `fornax.weight_formats`: canonical JSON {tensor name: [format, [logical shape]]} for every
tensor not stored as plain float32. A file without the key holds plain tensors whose dtype is
their format (a Hugging Face checkpoint).
"""

from __future__ import annotations

import json

from libs.weights.errors import WeightBlockInvalidError

FORMATS_METADATA_KEY = "fornax.weight_formats"


def encode_formats(formats: dict[str, tuple[str, tuple[int, ...]]]) -> str:
    return json.dumps({n: [f, list(s)] for n, (f, s) in sorted(formats.items())}, separators=(",", ":"))


def decode_formats(metadata: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    raw = metadata.get(FORMATS_METADATA_KEY)
    if raw is None:
        return {}
    try:
        table = json.loads(raw)
        return {str(n): (str(f), tuple(int(d) for d in s)) for n, (f, s) in table.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise WeightBlockInvalidError(f"{FORMATS_METADATA_KEY} is malformed: {exc}") from exc
