"""CLI argument parsing for `fornax evidence` (no registry needed)."""

from __future__ import annotations

import pytest

from apps.cli.evidence_registry import UsageError, build_content, parse_instant_ns, parse_labels, parse_layers
from apps.cli.main import build_parser
from libs.common.kinds import DType
from services.evidence_registry.domain import EvidenceClass, LayerRange, RecordType


def test_instants_parse_from_ns_and_iso8601():
    assert parse_instant_ns("1700000000000000000") == 1_700_000_000_000_000_000
    assert parse_instant_ns("2023-11-14T22:13:20Z") == 1_700_000_000_000_000_000
    assert parse_instant_ns("2023-11-14T23:13:20.5+01:00") == 1_700_000_000_500_000_000
    for bad in ("yesterday", "2023-11-14T22:13:20"):
        with pytest.raises(UsageError):
            parse_instant_ns(bad)


def test_labels_and_layers_parse():
    assert parse_labels(["b=2", "a=1", "a=3"]) == (("a", "3"), ("b", "2"))
    assert parse_layers("0:12") == LayerRange(0, 12)
    for bad in ("nolabel",):
        with pytest.raises(UsageError):
            parse_labels([bad])
    for bad in ("3", "a:b", "-1:2"):
        with pytest.raises(UsageError):
            parse_layers(bad)


def test_put_arguments_build_a_physical_record():
    args = build_parser().parse_args([
        "evidence", "put", "--type", "measurement", "--class", "physical", "--blob", "x.json",
        "--hardware", "h100", "--backend-build", "max 26.7.0", "--model-snapshot", "sha256:ab",
        "--command", "fornax bench stage", "--layers", "0:4", "--dtype", "bf16",
        "--label", "node=a", "--valid-until", "2030-01-01T00:00:00Z"])
    content = build_content(args)
    assert (content.type, content.evidence_class) == (RecordType.MEASUREMENT, EvidenceClass.PHYSICAL)
    assert content.provenance.layer_range == LayerRange(0, 4)
    assert content.provenance.dtype is DType.BF16
    assert content.labels == (("node", "a"),)
    assert content.validity.valid_until_unix_ns == 1_893_456_000_000_000_000
