"""A process's own resident memory beyond its weights and KV, from `/proc/<pid>/smaps`.

Pure core: `resident_sample` reads the text of an smaps file and splits the process's resident
pages (every mapping's `Rss`) into the file pages of its weight files (mappings of files under
`weight_dirs`: stage weights are copy-on-write maps of the artifact, which the plan counts as
weights), and the rest. A weight mapping's `Anonymous` pages are pages copied on write, so they
count as the runtime's, not as weights. The caller names the weights it holds as arrays of its
own (converted from the file, `libs.profiles.measure.weight_copy_bytes`) and the bytes its KV
stores hold, which the plan counts as weights and KV. `read_resident_sample` is the thin shell
that reads this process's file.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Sequence
from pathlib import Path

from libs.profiles.schema import ResidentSample

_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+\s+\S+\s+\S+\s+\S+\s+\d+\s*(.*)$")
_FIELD = re.compile(r"^(\w+):\s+(\d+)\s+kB$")


def _under(path: str, roots: Sequence[str]) -> bool:
    return bool(path) and any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def resident_sample(point: str, smaps_text: str, weight_dirs: Sequence[str], weight_copy_bytes: int,
                    kv_bytes: int) -> ResidentSample:
    """The sample `point` of an smaps text: total Rss, total Anonymous, and the file pages of
    mappings whose path lies under one of `weight_dirs` (absolute, resolved)."""
    rss = anon = weight_file = 0
    in_weights = False
    mapping_rss = mapping_anon = 0

    def close_mapping() -> None:
        nonlocal weight_file
        if in_weights:
            weight_file += max(0, mapping_rss - mapping_anon)

    for line in smaps_text.splitlines():
        header = _HEADER.match(line)
        if header:
            close_mapping()
            in_weights = _under(header.group(1).removesuffix(" (deleted)"), weight_dirs)
            mapping_rss = mapping_anon = 0
            continue
        field = _FIELD.match(line)
        if field is None:
            continue
        name, value = field.group(1), int(field.group(2)) * 1024
        if name == "Rss":
            rss += value
            mapping_rss = value
        elif name == "Anonymous":
            anon += value
            mapping_anon = value
    close_mapping()
    return ResidentSample(point, rss, anon, weight_file, weight_copy_bytes, kv_bytes)


def read_resident_sample(point: str, weight_dirs: Sequence[str], weight_copy_bytes: int, kv_bytes: int,
                         smaps: Path = Path("/proc/self/smaps")) -> ResidentSample:
    """This process's sample now; collects garbage first, so a sample counts what is held, not
    what merely awaits the collector."""
    gc.collect()
    roots = [str(Path(d).resolve()) for d in weight_dirs]
    return resident_sample(point, smaps.read_text(encoding="utf-8", errors="replace"), roots, weight_copy_bytes,
                           kv_bytes)
