"""Fleet files: schema validation, cross-field checks, shipped examples."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apps.fleet.spec import FleetFileError, load_fleet_spec, parse_fleet_spec
from libs.common.kinds import Backend, DType

FLEETS = Path(__file__).resolve().parents[3] / "fleets"


def _raw(**overrides) -> dict:
    raw = {
        "version": 1,
        "control_host": "a",
        "hosts": [
            {"name": "a", "backend": "max", "cpu_cores": 1.5, "memory_limit": "2GiB", "link": {"rate": "1Gbit/s"}},
            {"name": "b", "backend": "numpy", "cpu_cores": 0.5, "memory_limit": 2**30, "link": {"rate": "200Mbit/s"},
             "clock_offset_s": 60},
        ],
    }
    raw.update(overrides)
    return raw


def test_a_valid_file_becomes_typed_hosts():
    spec = parse_fleet_spec(_raw(), "f" * 64)
    a, b = spec.hosts
    assert (a.backend, a.cpu_cores, a.memory_limit_bytes, a.link.rate_bits_per_s) == (Backend.MAX, 1.5, 2**31, 10**9)
    assert (b.backend, b.clock_offset_s, b.link.rate_bits_per_s, b.device) == (Backend.NUMPY, 60, 200 * 10**6, "cpu")
    assert spec.hop_dtypes == (DType.FP32,)


@pytest.mark.parametrize("path", sorted(FLEETS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_fleet_files_validate(path):
    spec = load_fleet_spec(path)
    assert len(spec.file_sha256) == 64
    assert spec.control_host in {h.name for h in spec.hosts}


def test_two_unlike_hosts_mixes_backends_and_quotas():
    spec = load_fleet_spec(FLEETS / "two-unlike-hosts.yaml")
    assert [(h.backend, h.cpu_cores) for h in spec.stage_hosts] == [(Backend.MAX, 1.5), (Backend.NUMPY, 0.5)]
    assert {h.link.rate_bits_per_s for h in spec.hosts} == {10**9}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"version": 2}, "version"),
    ({"control_host": "zz"}, "control_host"),
    ({"surprise": 1}, "surprise"),
    ({"hops": [{"boundary_dtype": "fp32"}, {"boundary_dtype": "fp32"}]}, "hops"),
])
def test_invalid_files_name_the_field(overrides, message):
    with pytest.raises(FleetFileError, match=message):
        parse_fleet_spec(_raw(**overrides), "0" * 64)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cpu_cores", 0, "cpu_cores"),
    ("backend", "cuda", "backend"),
    ("device", "tpu", "device"),
    ("name", "Has-Caps", "name"),
    ("memory_limit", "lots", "memory_limit"),
    ("memory_limit", "1MiB", "memory_limit"),
])
def test_invalid_hosts_are_refused(field, value, message):
    raw = _raw()
    raw["hosts"][1][field] = value
    with pytest.raises(FleetFileError, match=message):
        parse_fleet_spec(raw, "0" * 64)


def test_duplicate_host_names_are_refused():
    raw = _raw()
    raw["hosts"][1]["name"] = "a"
    with pytest.raises(FleetFileError, match="unique"):
        parse_fleet_spec(raw, "0" * 64)


def test_dtype_override_applies_unless_the_file_sets_hops():
    assert parse_fleet_spec(_raw(), "0" * 64, DType.BF16).hop_dtypes == (DType.BF16,)
    per_hop = _raw(hops=[{"boundary_dtype": "fp32"}])
    assert parse_fleet_spec(per_hop, "0" * 64, DType.BF16).hop_dtypes == (DType.FP32,)


def test_file_hash_is_of_its_bytes(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    first = load_fleet_spec(path).file_sha256
    path.write_text(yaml.safe_dump(_raw(control_host="b")))
    assert load_fleet_spec(path).file_sha256 != first


def test_unreadable_and_non_yaml_files_are_refused(tmp_path):
    with pytest.raises(FleetFileError, match="cannot read"):
        load_fleet_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [unclosed")
    with pytest.raises(FleetFileError, match="not YAML"):
        load_fleet_spec(bad)
