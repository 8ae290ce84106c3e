"""A process's resident memory beyond its weights and KV: smaps arithmetic, the real process,
and the stage profile's record of it round-tripping through its canonical JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from libs.profiles.measure import weight_copy_bytes
from libs.profiles.resident import read_resident_sample, resident_sample
from libs.profiles.schema import (
    ProfileFormatError,
    ResidentSample,
    RuntimeResident,
    stage_profile_from_json,
    to_json,
)
from libs.weights.formats import FORMATS
from libs.weights.tensor import PackedWeight
from tests.unit.planner.profile_factories import stage_profile

KIB, MIB = 1024, 2**20
SMAPS = """\
55d0c0a00000-55d0c0b00000 r-xp 00000000 08:01 1234                       /usr/bin/python3.12
Size:               1024 kB
Rss:                 800 kB
Anonymous:             0 kB
55d0c1000000-55d0c2000000 rw-p 00000000 00:00 0                          [heap]
Rss:                4096 kB
Anonymous:          4096 kB
7f0000000000-7f0000400000 r--p 00001000 08:01 99                         /cache/artifacts/abc/model-00001.safetensors
Rss:                3000 kB
Anonymous:           200 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Rss:                 100 kB
Anonymous:           100 kB
7f0000500000-7f0000600000 r--p 00000000 08:01 77                         /cache/artifacts/abcdef/other.safetensors
Rss:                 500 kB
Anonymous:             0 kB
"""


def test_weight_file_pages_are_split_from_the_rest_and_kv_is_taken_off():
    s = resident_sample("after load", SMAPS, ["/cache/artifacts/abc"], weight_copy_bytes=500 * KIB,
                        kv_bytes=1000 * KIB)
    assert s.rss_bytes == (800 + 4096 + 3000 + 100 + 500) * KIB
    assert s.anon_bytes == (4096 + 200 + 100) * KIB
    # the copy-on-write pages of the weight map are the runtime's; a sibling directory is not a weight dir
    assert s.weight_file_bytes == (3000 - 200) * KIB
    assert s.runtime_bytes == s.rss_bytes - 2800 * KIB - 500 * KIB - 1000 * KIB


def test_a_sample_never_reads_below_zero():
    assert ResidentSample("x", 10, 0, 8, 1, 8).runtime_bytes == 0


def test_this_process_counts_a_mapped_weight_file_as_weights_not_runtime(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    path = weights / "w.safetensors"
    path.write_bytes(np.arange(4 * MIB, dtype=np.uint8).tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="c")
    assert int(mapped.sum(dtype=np.int64)) > 0  # every page touched
    now = read_resident_sample("mapped", [str(weights)], 0, 0)
    assert 4 * MIB - 64 * KIB <= now.weight_file_bytes <= 4 * MIB + 64 * KIB
    text = Path("/proc/self/smaps").read_text()  # one reading, two readers
    with_weights = resident_sample("mapped", text, [str(weights.resolve())], 0, 0)
    without = resident_sample("mapped", text, [], 0, 0)
    assert without.weight_file_bytes == 0 and with_weights.weight_file_bytes >= 4 * MIB - 64 * KIB
    assert with_weights.runtime_bytes == without.runtime_bytes - with_weights.weight_file_bytes
    del mapped


def test_the_runtime_reserve_is_the_largest_sample_and_round_trips_in_the_stage_profile():
    resident = RuntimeResident((ResidentSample("after load of layers [0, 3)", 900 * MIB, 600 * MIB, 100 * MIB, 0, 0),
                                ResidentSample("after the profiled steps of layers [0, 3)", 1200 * MIB, 800 * MIB,
                                               150 * MIB, 20 * MIB, 30 * MIB)))
    assert resident.reserve_bytes == 1000 * MIB
    profile = dataclasses.replace(stage_profile("alpha", "sha256:" + "1" * 64), runtime_resident=resident)
    back = stage_profile_from_json(to_json(profile))
    assert back == profile and back.runtime_resident is not None and back.runtime_resident.reserve_bytes == 1000 * MIB


def test_an_older_profile_has_no_measured_reserve_and_a_broken_one_is_refused():
    blob = json.loads(to_json(stage_profile("alpha", "sha256:" + "1" * 64)))
    del blob["runtime_resident"]
    assert stage_profile_from_json(json.dumps(blob).encode()).runtime_resident is None
    blob["runtime_resident"] = {"samples": [{"point": "x"}], "method": "m"}
    with pytest.raises(ProfileFormatError):
        stage_profile_from_json(json.dumps(blob).encode())


def test_weights_held_as_arrays_of_their_own_are_told_from_mapped_ones(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(4096))
    mapped = np.memmap(path, dtype=np.float32, mode="c", shape=(1024,))
    record = {"mapped": mapped, "view": mapped[:512], "copy": np.asarray(mapped, dtype=np.float64),
              "packed": PackedWeight(FORMATS["q8_0"], (32,), np.zeros(34, np.uint8))}
    assert weight_copy_bytes(list(record.values())) == 1024 * 8 + 34
    assert weight_copy_bytes([mapped, mapped[:512]]) == 0
    owned = np.zeros(1024, np.float32).view(np.memmap)  # of class np.memmap, with no map behind it
    assert weight_copy_bytes({3: [owned]}) == 4096
