"""A stage manifest's build-time conversions in a few lines, for `fornax status` and `/v1/models`.

Tensors converted the same way (same source dtype, wanted and held format) are counted together,
with one tensor's recorded reason, so a model with thousands of experts still reads in a line
per kind of conversion. Tensors kept as the policy or the source wanted them are not listed.
"""

from __future__ import annotations

from collections import Counter

from libs.artifacts.manifest import StageManifest


def conversion_summary(manifest: StageManifest) -> tuple[str, ...]:
    counts: Counter[tuple[str, str, str]] = Counter()
    example: dict[tuple[str, str, str], tuple[str, str]] = {}
    for tensor in manifest.tensors:
        f = tensor.weight_format
        if not f.conversion:
            continue
        key = (f.source_dtype, f.wanted, f.format)
        counts[key] += 1
        example.setdefault(key, (tensor.name, f.conversion))
    return tuple(f"{n} tensor{'s' if n > 1 else ''} {source} wanted {wanted}, held {held} "
                 f"(e.g. {example[key][0]}: {example[key][1]})"
                 for key, n in sorted(counts.items()) for source, wanted, held in (key,))
