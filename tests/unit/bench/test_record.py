"""The pure core of `--record`: what a bench report becomes in the registry."""

from __future__ import annotations

import argparse
import json

import pytest

from apps.bench.record import RecordError, RunFacts, measurement_record, shapes_of
from libs.common.kinds import DType
from services.evidence_registry.domain import EvidenceClass, RecordType
from services.evidence_registry.validation import check_content

FACTS = RunFacts(bench="serve", host="h1", hardware="EPYC, 2 usable CPUs", quota="2 usable CPUs, load 3.0",
                 backend_build="numpy 2.4.6, python 3.11.7", model_snapshot="sha256:" + "ab" * 32, num_layers=4,
                 shapes="bench arguments: concurrency=1,8,32", command="fornax bench serve --record")


def test_a_report_becomes_a_physical_measurement_naming_host_quota_build_snapshot_and_command():
    content, blob = measurement_record({"one_stage_vs_transformers_c32": 1.5}, FACTS)
    check_content(content)  # what the registry checks on put
    assert (content.type, content.evidence_class) == (RecordType.MEASUREMENT, EvidenceClass.PHYSICAL)
    p = content.provenance
    assert "h1" in p.hardware and "load 3.0" in p.hardware
    assert (p.backend_build, p.model_snapshot, p.command) == (FACTS.backend_build, FACTS.model_snapshot,
                                                              FACTS.command)
    assert (p.layer_range.layer_start, p.layer_range.layer_end, p.dtype) == (0, 4, DType.FP32)
    assert json.loads(blob)["figures"] == {"one_stage_vs_transformers_c32": 1.5}


@pytest.mark.parametrize("report", [{}, []])
def test_an_empty_report_is_refused(report):
    with pytest.raises(RecordError) as caught:
        measurement_record(report, FACTS)
    assert caught.value.reason == "EMPTY_REPORT"


def test_shapes_name_the_sizing_arguments_but_not_the_recording_ones():
    args = argparse.Namespace(bench="serve", concurrency="1,8,32", max_tokens=16, json=True, record=True,
                              registry="x:1", sign_as=None, state_dir=".fornax", func=print, fleet=None)
    assert shapes_of(args) == "bench arguments: concurrency=1,8,32 max_tokens=16"
